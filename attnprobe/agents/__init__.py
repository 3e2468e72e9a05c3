"""What every agent scaffold and every study that rebuilds an agent's context shares.

The NIS-Agent runner, the in-the-loop scaffolds, IBIS (whose direct framing is the runner's isolated
filter) and the after-the-fact counterfactuals are independent studies; the pieces they have in common
live here, below all of them:

- :mod:`.search`: search backends (offline BM25 over the shipped corpus, an HTTP search API);
- :mod:`.tools`: the tool schemas and the toolbox that executes calls (search, visit, find);
- :mod:`.filter`: the context-isolated filter's prompt and the parser of its verdict;
- :mod:`.recorder`: every model call written exactly as sent and received, as a trajectory;
- :mod:`.policies` and :mod:`.refiners`: context policies (observation masking, IRCoT variants,
  refiners), applied after the fact (counterfactuals) or in the loop;
- :mod:`.context`: a policy inside an agent loop (the view sent at each step, the once-per-round
  refinement, the link from each recorded call to the full history), used by the loop's scaffolds and
  the runner's search worker;
- :mod:`.tagtext`: tag text (Search-R1 / IRCoT) to rounds and back, labelled, so the IRCoT loop and the
  counterfactuals apply one policy to what a tag-format agent saw.
- :mod:`.questions` and :mod:`.answers`: the one question-file reader and the one exact-match scorer
  (Search-R1 / SQuAD normalisation) of the runner and the loop.
"""
