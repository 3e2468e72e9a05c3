"""The manager agent: delegates sub-tasks to the search worker and decides when the answer is ready.

With validation on, the first proposed answer triggers the isolation-based stepwise validation
(seed 000, 4.2: stage 1 and stage 2; "If all steps are valid, it confirms the final answer as
correct"); the manager then sees the outcome and answers again or keeps working (the second
final_answer is accepted). ``final_check`` (ours, off by default) adds a third, task-aware gate.
A validation that does not accept the answer gives the manager ``validation_extra_steps`` (ours,
3) more steps to act on the suggestions, so a failed validation never ends the run by itself. A run always ends with an answer: when the step
budget is spent the manager is asked once more, with only final_answer available.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import attnprobe.studies.runner.validation as V
from attnprobe.agents.recorder import Recorder
from attnprobe.agents.tools import (
    FINAL_ANSWER,
    MANAGER_TOOLS,
    ToolBox,
    arg,
    call_args,
    call_format,
    no_call_hint,
    out_of_steps,
    tool_lines,
)
from attnprobe.studies.runner.config import RunSettings
from attnprobe.studies.runner.worker import SearchWorker, action_format, agent_turn, unknown_tool

log = logging.getLogger(__name__)

MANAGER_SYSTEM = (
    "You are the manager of a research team. Answer the user's task.\n"
    f"Tools:\n{tool_lines(MANAGER_TOOLS)}\n"
    "Give search_worker one focused question at a time. When a report answers the task, call final_answer."
)
CALL_HINT = call_format("search_worker", {"task": "what to find out"})
NO_CALL_HINT = no_call_hint(CALL_HINT)
OUT_OF_STEPS = out_of_steps("your best answer", "your answer")


@dataclass
class ManagerOutcome:
    answer: str
    steps: int = 0
    delegations: int = 0
    parse_failures: int = 0
    forced: bool = False
    cut_off: bool = False  # the answer was read from a reply cut at the token limit (finish_reason "length")
    validation: dict = field(default_factory=dict)
    worker_reports: list[dict] = field(default_factory=list)
    histories: list = field(default_factory=list)  # the workers' ContextHistory under a context policy


class Manager:
    def __init__(self, rec: Recorder, toolbox: ToolBox, settings: RunSettings):
        self.rec, self.toolbox, self.settings = rec, toolbox, settings

    # --- validation ------------------------------------------------------------------------------
    def validate(self, task: str, answer: str, memory: list[tuple[str, str]]) -> tuple[bool, str, dict]:
        """Returns (accepted, feedback for the manager, summary for the results file)."""
        items = V.memory_items(task, memory)
        reply = self.rec.call("validator_stage1", V.stage1_messages(task, answer, items), None,
                              extra_meta={"proposed_answer": answer})
        steps, parsed = V.parse_chain(reply.content, items, answer)
        info: dict = {"mode": self.settings.validation, "chain_parsed": parsed}
        if self.settings.validation == "stage1":
            info.update(steps=len(steps), chain=V.chain_text(steps))
            feedback = ("Validation, stage 1: your work reorganised as a reasoning chain:\n" + V.chain_text(steps)
                        + f"\nCheck each step. If the answer {answer!r} is supported, call final_answer again; "
                          "otherwise continue with search_worker.")
            return False, feedback, info
        steps, added = V.with_answer_step(steps, answer)
        checked, unchecked = V.steps_to_check(steps, self.settings.max_validation_steps)
        if unchecked:
            log.info("validation: %d steps, cap %d: %s unchecked (the answer step %s is always checked)",
                     len(steps), self.settings.max_validation_steps, ", ".join(unchecked), steps[-1].label)
        info.update(steps=len(steps), chain=V.chain_text(steps), answer_step=steps[-1].label,
                    answer_step_added=added, checked=[s.label for s in checked], unchecked=unchecked)
        verdicts = []
        for step in checked:
            premises = V.premises_for(step, items, steps)
            r = self.rec.call("validator_stage2", V.stage2_messages(step, premises), None,
                              extra_meta={"step": step.label, "premises": list(premises),
                                          "answer_step": step is steps[-1]})
            verdict, suggestion = V.parse_verdict(r.content)
            verdicts.append({"step": step.label, "verdict": verdict, "suggestion": suggestion})
        info["verdicts"] = verdicts
        verdict, suggestion = "valid", ""
        if self.settings.final_check:  # ours, not the seed's: a third gate (RunSettings.final_check)
            r = self.rec.call("validator_final", V.final_messages(task, answer, steps), None,
                              extra_meta={"proposed_answer": answer})
            verdict, suggestion = V.parse_verdict(r.content)
            info["final_check"] = {"verdict": verdict, "suggestion": suggestion}
        bad = [v for v in verdicts if v["verdict"] != "valid"]
        if not bad and verdict == "valid":
            return True, "", info
        problems = [f"- {v['step']}: {v['verdict']}" + (f": {v['suggestion']}" if v["suggestion"] else "") for v in bad]
        if verdict != "valid":
            problems.append(f"- does the answer answer the task? {verdict}" + (f": {suggestion}" if suggestion else ""))
        feedback = ("Validation found problems in the reasoning behind your answer:\n" + "\n".join(problems)
                    + f"\nDecide: call final_answer to keep {answer!r} or a corrected answer, or continue with "
                      "search_worker.")
        return False, feedback, info

    # --- main loop -------------------------------------------------------------------------------
    def run(self, task: str) -> ManagerOutcome:
        out = ManagerOutcome(answer="")
        messages: list[dict] = [{"role": "system", "content": MANAGER_SYSTEM}, {"role": "user", "content": f"Task: {task}\n\n{CALL_HINT}"}]
        memory: list[tuple[str, str]] = []
        validated = False
        budget = self.settings.manager_steps
        step = 0
        while step < budget:
            out.steps += 1
            reply, calls = agent_turn(self.rec, "manager", messages, MANAGER_TOOLS, {"step": step}, NO_CALL_HINT,
                                      actions=action_format(self.settings, "nis-manager", MANAGER_TOOLS))
            step += 1
            if not calls:
                out.parse_failures += 1
                continue
            for call in calls:
                name, args = call["function"]["name"], call_args(call)
                if name == "final_answer":
                    answer = arg(args, "answer")
                    if self.settings.validation == "off" or validated:
                        out.answer = answer
                        return out
                    validated = True
                    accepted, feedback, info = self.validate(task, answer, memory)
                    extra = 0 if accepted else self.settings.validation_extra_steps
                    budget += extra
                    out.validation = {**info, "proposed_answer": answer, "accepted": accepted, "extra_steps": extra}
                    if accepted:
                        out.answer = answer
                        return out
                    obs = feedback + (f"\nYou have {budget - step} more step(s)." if extra else "")
                elif name == "search_worker":
                    sub = arg(args, "task") or task
                    out.delegations += 1
                    rep = SearchWorker(self.rec, self.toolbox, self.settings, out.delegations).run(sub)
                    out.worker_reports.append({"task": sub, **rep.summary()})
                    if rep.history is not None:
                        out.histories.append((sub, rep.history))
                    obs = rep.report
                    memory.append((f"search_worker({sub!r})", rep.report))
                else:
                    obs = unknown_tool(name, MANAGER_TOOLS)
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": obs})
        out.forced = True
        messages.append({"role": "user", "content": OUT_OF_STEPS})
        reply = self.rec.call("manager", messages, [FINAL_ANSWER], extra_meta={"step": "forced"},
                              actions=action_format(self.settings, "nis-manager", [FINAL_ANSWER]))
        if reply.tool_calls and reply.tool_calls[0]["function"]["name"] == "final_answer":
            out.answer = arg(call_args(reply.tool_calls[0]), "answer")
        if not out.answer:
            lines = [ln.strip() for ln in reply.content.splitlines() if ln.strip()]
            out.answer = lines[0][:200] if lines else ""
            # a reply cut at the token limit (e.g. the manager's JSON call cut after "```json"): its first
            # line is recorded as the answer, and the run says so (run_one warns)
            out.cut_off = reply.finish_reason == "length"
        return out
