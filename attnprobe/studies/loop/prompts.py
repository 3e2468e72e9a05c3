"""Prompt templates of the two scaffolds and the judge, with where each comes from.

Neither seed prints its templates in the text we have (seed 002 describes appendix F, seed 004 points to
its appendix F); where a template is published by the work the seed follows, we quote that one, else the
text is ours. docs/methods.md ("Policies in the loop") lists which is which.
"""

from __future__ import annotations

import hashlib

from attnprobe.agents.searchr1 import INVALID
from attnprobe.agents.tools import tool_lines
from attnprobe.studies.loop.pool import TOOLS

# Seed 004 §2: "Following Jin et al. (2025), LLMs are instructed to encapsulate their search queries,
# retrieved documents, and final answer between specially designated tokens". This is Search-R1's
# (Jin et al. 2025) published instruction, verbatim (its "base" template), with the question appended.
IRCOT_PROMPT = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query "
    "</search> and it will return the top searched results between <information> and </information>. "
    "You can search as many times as your want. "
    "If you find no further external knowledge needed, you can directly provide the answer inside <answer> and "
    "</answer>, without detailed illustrations. For example, <answer> Beijing </answer>. Question: {question}\n")

# Search-R1's reply to a turn with neither a query nor an answer (verbatim; the multi-turn form sends it as a
# user message, without the newlines around it that the Search-R1 stream appends: searchr1.INVALID).
IRCOT_INVALID = INVALID.strip("\n")


# Seed 002, "System Prompt" (p. 22): "The agent prompt requests interleaved search and reasoning, cited
# explanations, exact answers, and confidence". The seed does not print it; its released scaffold does
# (i-DeepSearch/observation-masking, utils/prompts.py, DEVELOPER_CONTENT), and it is the same for every
# setting, masked or not: it never mentions masking. We send its first paragraph and its answer format
# verbatim (double braces included: the release sends that string unformatted), and between them two
# lines for our browser: the release's own sentence on cursors, and the page pool (seed 002 §2.3), which
# every setting has. Left out: the release's citation syntax and "Do not quote more than 10 words" (its
# renderer's line markers, which ours does not print), "sources=web" and "Today's date" (a run would
# depend on the day).
SEED002_INTRO = (
    "You are a deep research agent. You need to answer the given question by interacting with a search engine, "
    "using the search tool provided. Please perform reasoning and use the tool step by step, in an interleaved "
    "manner. You may use the search tool multiple times.")
SEED002_BROWSER = (  # the first sentence is the release's; the second ours (the page pool, seed 002 §2.3)
    "The `cursor` appears in brackets before each browsing display: `[{cursor}]`.\n"
    "Every page you have seen keeps its cursor: open or find it again by that number.")
SEED002_FORMAT = (
    "Your response should be in the following format:\n"
    "Explanation: {{your explanation for your final answer. For this explanation section only, you should cite "
    "your evidence documents inline by enclosing their docids in square brackets [] at the end of sentences. "
    "For example, [20].}}\n"
    "Exact Answer: {{your succinct, final answer}}\n"
    "Confidence: {{your confidence score between 0% and 100% for your answer}}")
SEED002_SYSTEM = f"{SEED002_INTRO}\n\n{SEED002_BROWSER}\n\n{SEED002_FORMAT}"

# Seed 002 §F.4 (parallel tool-call instruction): "Independent calls can appear as consecutive tool-call
# blocks in one response." The release picks the sentence per chat template (i-DeepSearch/observation-masking,
# utils/tool_parsers.py, parallel_tool_instruction_for_model), verbatim here: a DeepSeek model id gets the
# DeepSeek sentence; a template with "<tool_call>" and "<function=" (Qwen3.5, Qwen3-Coder: XML calls) the Qwen
# sentence (QWEN_STYLE_PARALLEL_TOOL_INSTRUCTION); a template with "<tool_call>" alone (JSON calls: Qwen2.5,
# Qwen3, Hermes) the <tool_call> sentence; any other template none (SmolLM2's).
SEED002_PARALLEL = {
    "deepseek": ("When several function calls are independent, issue them as MULTIPLE parallel tool calls in "
                 "the same response."),
    "qwen-xml": ("When several function calls are independent, you may issue parallel tool calls by outputting "
                 "multiple consecutive `<tool_call>...</tool_call>` blocks in the same assistant turn, one "
                 "function call per block."),
    "tool-call": ("When several function calls are independent, issue them in parallel by outputting multiple "
                  "consecutive <tool_call>...</tool_call> blocks in the same response, one function call per "
                  "block."),
    "none": "",
}
# The JSON call shown after the tool list (ours, below); never for XML-call templates, whose own instructions
# show the XML form.
SEED002_CALL_EXAMPLE = 'Call a tool with JSON, for example {"name": "search", "arguments": {"query": "keywords"}}.'


def template_family(chat_template: str | None, model: str = "") -> str:
    """The release's choice of parallel-call sentence (a key of :data:`SEED002_PARALLEL`) for a model id and
    its chat template. Where the template is not at hand (a served model), ours: the model name decides
    ("qwen3.5", "qwen3.6" or "qwen3-coder": qwen-xml; another "qwen": tool-call; else none)."""
    model = (model or "").lower()
    if "deepseek" in model:
        return "deepseek"
    if chat_template is not None:
        if "<tool_call>" in chat_template and "<function=" in chat_template:
            return "qwen-xml"
        return "tool-call" if "<tool_call>" in chat_template else "none"
    if any(k in model for k in ("qwen3.5", "qwen3.6", "qwen3-coder")):
        return "qwen-xml"
    return "tool-call" if "qwen" in model else "none"


def seed002_system(tools: list[dict], family: str = "none") -> str:
    """The system prompt: the release's text, its parallel-call sentence for the template ``family``
    (:func:`template_family`), then the tools listed and, unless the template calls in XML, one JSON call
    shown (ours: chat templates that ignore the ``tools`` argument, SmolLM2's, would otherwise never show
    the model its tools; with a native tool template the list is shown twice, which costs tokens but changes
    no tool). The same for every setting."""
    parallel = SEED002_PARALLEL[family]
    example = "" if family == "qwen-xml" else SEED002_CALL_EXAMPLE
    return (f"{SEED002_SYSTEM}\n\n" + (f"{parallel}\n\n" if parallel else "")
            + f"Tools:\n{tool_lines(tools)}" + (f"\n{example}" if example else ""))


# The release sends the question alone as the user message (deploy_agent.py: {"role": "user", "content":
# question}); the answer format is in the system prompt.
SEED002_TASK = "{question}"

# Seed 002 §F.5 (LLM-as-judge): "The judge permits a small numerical margin of error but rejects
# inconsistency, ambiguity, or non-equivalence. It extracts reported confidence and defaults to 100 when
# confidence is absent." The seed does not print it; this is the BrowseComp grader template
# (openai/simple-evals, used by BrowseComp-Plus), which is exactly that description.
JUDGE_PROMPT = """Judge whether the following [response] to [question] is correct or not based on the precise and \
unambiguous [correct_answer] below.

[question]: {question}

[response]: {response}

Your judgement must be in the format and criteria specified below:

extracted_final_answer: The final exact answer extracted from the [response]. Put the extracted answer as 'None' \
if there is no exact, final answer to extract from the response.

[correct_answer]: {correct_answer}

reasoning: Explain why the extracted_final_answer is correct or incorrect based on [correct_answer], focusing only \
on if there are meaningful differences between [correct_answer] and the extracted_final_answer. Do not comment on \
any background to the problem, do not attempt to solve the problem, do not argue for any answer different than \
[correct_answer], focus only on whether the answers match.

correct: Answer 'yes' if extracted_final_answer matches the [correct_answer] given above, or is within a small \
margin of error for numerical problems. Answer 'no' otherwise, i.e. if there if there is any inconsistency, \
ambiguity, non-equivalency, or if the extracted answer is incorrect.


confidence: The extracted confidence score between 0% and 100% from [response]. Put 100 if there is no \
confidence score available."""


def prompts_hash(scaffold: str) -> str:
    """A short fingerprint of a scaffold's templates: a finished run is reused only with the same prompts."""
    texts = ((IRCOT_PROMPT, IRCOT_INVALID) if scaffold == "ircot" else (IRCOT_PROMPT, INVALID)
             if scaffold == "ircot-stream"  # seed002: the prompt of every template family
             else (*(seed002_system(TOOLS, f) for f in SEED002_PARALLEL), SEED002_TASK))
    return hashlib.sha256("\0".join(texts).encode()).hexdigest()[:12]
