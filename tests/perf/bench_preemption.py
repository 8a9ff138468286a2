"""Preemption: what a checkpoint-aware preemption costs a 2-rank DDP job, against a plain SIGTERM-and-kill.

    python tests/perf/bench_preemption.py [--reps N] [--checkpoint-every 20] [--step-seconds 0.1] [--steps 140]
                                          [--preemptor-steps 80] [--preempt-from 80] [--grace 30] [--no-warmup]
                                          [--keep] [--markdown]
    python tests/perf/bench_preemption.py --render RESULT.json     # the README rows of a saved JSON line

A local stack is started here (Temporal dev server, one ``gangflow worker``, ONE ``gangflow node`` agent with
2 GPU slots, all on 127.0.0.1) with one tenant and two priority classes, ``low`` and ``high`` (the policy
preempts lower-priority gangs of a tenant; ``--grace`` is the cluster's preemption grace). Each preemption:

1. the **victim**, ``examples/multitenant.py:pipeline`` in class ``low`` (task ``train``: 2-rank torch DDP on
   CPU with gloo, ``PyTorch(nnodes=1, nproc_per_node=2)``, both GPU slots, a checkpoint every
   ``--checkpoint-every`` steps, ``engine.report(step=...)`` every step), trains;
2. once both its ranks reported the rep's trigger step, the **preemptor** (the same pipeline, class ``high``,
   ``--preemptor-steps`` steps) is submitted; the Scheduler preempts the victim for it. The trigger steps
   lie past ``--preempt-from`` and spread over one checkpoint interval across the reps (the same in both
   runs of a rep), so that the kill lands anywhere between two periodic checkpoints;
3. the preemptor runs and finishes, the GPUs come back, the victim resumes from its checkpoint (attempt 1)
   and finishes its ``--steps``.

Per rep this runs twice, the order alternating between reps: **cooperative** (``cooperate=True``: every rank
checks ``checkpoint.stop_requested()`` each step, agreed by an all-reduce, saves a checkpoint at the step it
reached and returns) and **kill** (``cooperate=False``: the notice's SIGTERM stops the ranks at once and the
gang resumes from its last periodic checkpoint: a plain SIGTERM-and-kill preemption, what Kueue does). One
uncounted warm-up run first (``--no-warmup`` skips it): bundle extraction on the node.

The node agent keeps warm standby rank processes (torch imported ahead) and refills them on its 5 s
registration tick: a gang that starts within seconds of the previous one's start finds none and imports
torch first, seconds more on this machine. The defaults let the victim train and the preemptor run ~9 s
each, so that the preemptor's and the resumed victim's ranks both find standbys, as on a cluster where
gangs do not start seconds apart; each sample says whether they did (``preemptor_from_standby``,
``resumed_from_standby``: every rank's process was created before its ``run_ranks`` activity started).

Measured, on this machine's clock, from the **notice**: the moment the Scheduler's preemption reached the
victim (the ``preempt`` signal in the victim's GangTask history):

* ``notice_delivered_s``: the node agent wrote the rank's notice file and sent SIGTERM (the file's mtime;
  ``notice_from: history`` where the scan missed the file, and the notice activity's completion stands for it);
* ``save_s``: the ranks' checkpoint at the notice, from the notice delivered to the checkpoint file written
  (its mtime; the step in flight, the all-reduce that agrees on stopping, the save); none for a kill;
* ``gpus_free_s``: the victim's GangTask signalled ``release`` to the Scheduler (goal: ``save_s`` + 5 s);
* ``preemptor_first_step_s``: the preemptor's first ``engine.report`` (its rank's own ``time.time()``, from
  the ranks' progress files polled every 0.05 s; goal: ``save_s`` + 15 s);
* ``capacity_back_s``: the preemptor's GangTask released the GPUs (its run done); then
  ``resume_after_capacity_s``: from there to the victim's first report of attempt 1, and
  ``notice_to_resume_s``: from the notice to that report;
* ``steps_lost``: the step the victim had reached when it stopped minus the step attempt 1 resumed from
  (goal: ≤ 1 for the cooperative ranks; the kill loses the steps since its last periodic checkpoint, half an
  interval on average). The step reached is the checkpoint saved at the notice (cooperative, exact), else the
  last step reported before the notice was delivered, extrapolated to that moment at the measured step
  period (reports are throttled to one per 0.5 s).

Prints ONE JSON line to stdout (medians per mode, the goals with a boolean each, the samples and where the
time went) and a table to stderr (``--markdown``: the README's rows). Not a test: nothing here asserts on
timings.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DEFAULTS",
    "MODES",
    "NOTICE",
    "RUN_RANKS",
    "AnalysisError",
    "Observed",
    "analyse",
    "command_line",
    "markdown",
    "parse_args",
    "queue_config",
    "standby_age",
    "step_period",
    "summarise",
    "table",
    "trigger_steps",
]

MODES = ("cooperative", "kill")
TENANT = "bench"
TASK_CALL = "train-1"  # the GangTask id is "<run id>.train-1"
NODE_ID = "bench-0"
GPUS = 2
RUN_RANKS = "gangflow.run_ranks"
NOTICE = "gangflow.notice"
GOAL_FREE_SLACK_S = 5.0  # notice → GPUs free ≤ save + this
GOAL_FIRST_STEP_SLACK_S = 15.0  # notice → the preemptor's first step ≤ save + this
GOAL_STEPS_LOST = 1  # per cooperative preemption
PHASE_TIMEOUT_S = 180.0  # a run may take this long to reach a milestone on a busy 2-core machine
DEFAULTS = {
    "checkpoint_every": 20,
    "step_seconds": 0.1,
    "steps": 140,
    "preemptor_steps": 80,
    "preempt_from": 80,
    "grace": 30.0,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from benchenv import arguments, at_least_one, output_options

    parser = arguments(__doc__)
    parser.add_argument("--reps", type=int, default=5, help="preemptions per mode (medians reported)")
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=DEFAULTS["checkpoint_every"],
        help="the victim's checkpoint interval, steps",
    )
    parser.add_argument("--step-seconds", type=float, default=DEFAULTS["step_seconds"], help="sleep per step")
    parser.add_argument("--steps", type=int, default=DEFAULTS["steps"], help="the victim's training steps")
    parser.add_argument("--preemptor-steps", type=int, default=DEFAULTS["preemptor_steps"])
    parser.add_argument(
        "--preempt-from",
        type=int,
        default=DEFAULTS["preempt_from"],
        help="the victim's step after which its preemptor is submitted (the reps spread over the next interval)",
    )
    parser.add_argument("--grace", type=float, default=DEFAULTS["grace"], help="the cluster's preemption grace, s")
    parser.add_argument("--no-warmup", action="store_true", help="skip the uncounted warm-up run")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder (logs, checkpoints)")
    output_options(parser)
    args = parser.parse_args(argv)
    if args.render:
        return args
    at_least_one(parser, args, "reps", "checkpoint_every", "preemptor_steps", "preempt_from")
    for flag in ("step_seconds", "grace"):
        value = getattr(args, flag)
        if not math.isfinite(value) or value < 0:
            parser.error(f"--{flag.replace('_', '-')} must be a finite number >= 0, got {value}")
    if args.grace < 1:
        parser.error(f"--grace must be at least 1 s (the ranks need time to save), got {args.grace:g}")
    least = args.preempt_from + args.checkpoint_every + 20  # the last trigger + the ~10 steps a preemption takes
    if args.steps < least:
        parser.error(
            f"--steps must be at least --preempt-from + --checkpoint-every + 20 ({least}) so that the victim still "
            f"trains when the preemptor arrives, got {args.steps}"
        )
    return args


def trigger_steps(reps: int, every: int, start: int) -> list[int]:
    """The victim step at which the preemptor is submitted, per rep: past ``start`` and spread over one
    checkpoint interval, so that the kill's loss is sampled across it."""
    return [start + max(1, round((i + 0.5) * every / reps)) for i in range(reps)]


# ---------------------------------------------------------------------------------------------------------
# one preemption, observed: what the ranks, the node's files and the two GangTask histories said
# ---------------------------------------------------------------------------------------------------------
#: (event time, event type without EVENT_TYPE_, signal name or activity type)
Event = tuple[float, str, str]


class AnalysisError(RuntimeError):
    """A run did not go as the benchmark needs (no preemption, a milestone missing)."""


@dataclass
class Observed:
    """Everything seen of one preemption (times are epoch seconds on this machine)."""

    mode: str
    trigger_step: int
    victim_run: str
    preemptor_run: str
    #: (who: "victim" | "preemptor", attempt, rank) -> {step: the rank's time.time() of that report}
    reports: dict[tuple[str, int, int], dict[int, float]] = field(default_factory=dict)
    #: (who, attempt, rank) -> when that rank's process was created (a warm standby's: before its launch)
    proc_start: dict[tuple[str, int, int], float] = field(default_factory=dict)
    notice_t: float | None = None  # mtime of the victim's notice file (attempt 0)
    checkpoints: dict[int, float] = field(default_factory=dict)  # victim's checkpoint step -> mtime
    victim_events: list[Event] = field(default_factory=list)
    preemptor_events: list[Event] = field(default_factory=list)
    first_step: int = 0  # where the victim's final attempt started (its result)
    attempt: int = 0  # the victim's final attempt
    optimizer_steps: int = 0
    steps: int = 0
    preemptions: int = 0
    restarts: int = 0
    failed_attempts: list[dict[str, Any]] = field(default_factory=list)

    def add_report(self, who: str, attempt: int, rank: int, step: int, when: float) -> None:
        seen = self.reports.setdefault((who, attempt, rank), {})
        if step not in seen or when < seen[step]:
            seen[step] = when


def _first(events: list[Event], kind: str, detail: str | None = None, after: float = -math.inf) -> float | None:
    return next((t for t, k, d in events if k == kind and t >= after and (detail is None or d == detail)), None)


def _last(events: list[Event], kind: str, detail: str | None = None) -> float | None:
    found = [t for t, k, d in events if k == kind and (detail is None or d == detail)]
    return max(found) if found else None


def step_period(obs: Observed) -> float | None:
    """Seconds per step of the victim's attempt 0, from its ranks' reports (the training loop's pace)."""
    pairs = sorted(
        (s, t) for (who, att, _r), recs in obs.reports.items() if (who, att) == ("victim", 0) for s, t in recs.items()
    )
    pairs = [p for p in pairs if p[0] > 1]  # the first step carries the loop's warm-up
    if len(pairs) < 2 or pairs[-1][0] == pairs[0][0]:
        return None
    return (pairs[-1][1] - pairs[0][1]) / (pairs[-1][0] - pairs[0][0])


def first_report(obs: Observed, who: str, attempt: int, expected: int, period: float | None) -> tuple[float, bool]:
    """When the first step of ``who``'s ``attempt`` was done (any rank), and whether that was extrapolated: the
    earliest report seen may be a later step when the poll missed the first (reports are throttled)."""
    best: tuple[float, bool] | None = None
    for (w, att, _rank), recs in obs.reports.items():
        if (w, att) != (who, attempt) or not recs:
            continue
        step, when = min(recs.items(), key=lambda kv: kv[1])
        late = step > expected and period is not None
        moment = when - (step - expected) * period if late and period is not None else when
        if best is None or moment < best[0]:
            best = (moment, late)
    if best is None:
        raise AnalysisError(f"{obs.mode}: no report of the {who}'s attempt {attempt} was seen")
    return best


def standby_age(obs: Observed, who: str, attempt: int, launched: float | None) -> float | None:
    """How long before its launch (the ``run_ranks`` activity's start) the youngest rank process of ``who``'s
    ``attempt`` was created: > 0 for the node agent's standby processes, < 0 for ranks spawned fresh; None
    when not known."""
    starts = [t for (w, att, _r), t in obs.proc_start.items() if (w, att) == (who, attempt)]
    if launched is None or not starts:
        return None
    return round(launched - max(starts), 2)


def analyse(obs: Observed) -> dict[str, Any]:
    """One sample: the seconds from the notice to each milestone, the steps lost and where the time went."""
    victim, preemptor = obs.victim_events, obs.preemptor_events
    preempt = _first(victim, "WORKFLOW_EXECUTION_SIGNALED", "preempt")
    if preempt is None or obs.attempt < 1:
        raise AnalysisError(
            f"{obs.mode}: the victim {obs.victim_run} was not preempted (attempt {obs.attempt}, "
            f"{obs.preemptions} preemptions): raise --steps so that it still trains when the preemptor arrives"
        )
    notice_scheduled = _first(victim, "ACTIVITY_TASK_SCHEDULED", NOTICE, preempt)
    release = _first(victim, "SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED", "release", preempt)
    ranks_ended = _first(victim, "ACTIVITY_TASK_FAILED", RUN_RANKS, preempt)
    placed_again = _first(victim, "WORKFLOW_EXECUTION_SIGNALED", "placement", release or preempt)
    preemptor_placed = _first(preemptor, "WORKFLOW_EXECUTION_SIGNALED", "placement")
    capacity_back = _last(preemptor, "SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED", "release")
    # the notice file lives as long as the attempt's work folder: a rank that dies at once (kill mode) on a
    # loaded machine may take it away between two scans; then the notice activity's completion (the agent
    # answers once it wrote the file and signalled the ranks) stands for it, and the sample says so
    notice_from = "file" if obs.notice_t is not None else "history"
    delivered = obs.notice_t if obs.notice_t is not None else _first(victim, "ACTIVITY_TASK_COMPLETED", NOTICE, preempt)
    missing = [
        name
        for name, value in (
            ("the victim's release", release),
            ("the preemptor's placement", preemptor_placed),
            ("the preemptor's release", capacity_back),
            ("the notice (its file, or its activity's completion)", delivered),
        )
        if value is None
    ]
    if missing or release is None or capacity_back is None or delivered is None:
        raise AnalysisError(f"{obs.mode}: not seen: {', '.join(missing)}")
    if obs.first_step >= obs.steps:
        raise AnalysisError(
            f"{obs.mode}: the victim had done all its {obs.steps} steps when the notice came (it resumed from step "
            f"{obs.first_step}): raise --steps"
        )
    period = step_period(obs)
    ranks_started_again = _first(victim, "ACTIVITY_TASK_STARTED", RUN_RANKS, release)
    preemptor_ranks_started = _first(preemptor, "ACTIVITY_TASK_STARTED", RUN_RANKS)
    preemptor_first, preemptor_late = first_report(obs, "preemptor", 0, 1, period)
    resumed, resumed_late = first_report(obs, "victim", 1, obs.first_step + 1, period)

    attempt0 = [
        (s, t) for (w, att, _r), recs in obs.reports.items() if (w, att) == ("victim", 0) for s, t in recs.items()
    ]
    highest0 = max((s for s, _t in attempt0), default=0)
    before = [(s, t) for s, t in attempt0 if t <= delivered]
    last_before = max(before) if before else None
    # the checkpoint written at the notice: after the notice file, before the GPUs were given back
    saved = {s: t for s, t in obs.checkpoints.items() if delivered - 0.001 <= t <= release + 0.001}
    saved_step = max(saved) if saved else None
    if saved_step is not None:
        reached, how = max(saved_step, highest0), "checkpoint at the notice"
    else:
        estimate = highest0
        if last_before is not None and period:
            estimate = max(estimate, last_before[0] + math.floor((delivered - last_before[1]) / period))
        reached, how = estimate, "last report before the notice, extrapolated"
    save_s = saved[saved_step] - delivered if saved_step is not None else None

    def since(moment: float | None, origin: float = preempt) -> float | None:
        return None if moment is None else round(moment - origin, 3)

    return {
        "mode": obs.mode,
        "victim_run": obs.victim_run,
        "preemptor_run": obs.preemptor_run,
        "trigger_step": obs.trigger_step,
        "notice_delivered_s": since(delivered),
        "notice_from": notice_from,
        "save_s": None if save_s is None else round(save_s, 3),
        "gpus_free_s": since(release),
        "preemptor_placed_s": since(preemptor_placed),
        "preemptor_first_step_s": since(preemptor_first),
        "capacity_back_s": since(capacity_back),
        "resume_after_capacity_s": since(resumed, capacity_back),
        "notice_to_resume_s": since(resumed),
        "last_step_reported_before_notice": None if last_before is None else last_before[0],
        "saved_step": saved_step,
        "reached_step": reached,
        "reached_from": how,
        "resumed_from_step": obs.first_step,
        "steps_lost": reached - obs.first_step,
        "step_period_s": None if period is None else round(period, 4),
        "first_reports_extrapolated": {"preemptor": preemptor_late, "victim": resumed_late},
        # whether the ranks were the node agent's standby processes (> 0: torch imported ahead, if that long
        # sufficed) or spawned fresh (< 0: they import torch first)
        "preemptor_standby_age_s": standby_age(obs, "preemptor", 0, preemptor_ranks_started),
        "resumed_standby_age_s": standby_age(obs, "victim", 1, ranks_started_again),
        "optimizer_steps": obs.optimizer_steps,
        "steps": obs.steps,
        "restarts": obs.restarts,
        "preemptions": obs.preemptions,
        "failed_attempts": obs.failed_attempts,
        # where the time from the notice to the GPUs free, and from capacity back to the resume, went
        "breakdown_s": {
            "preempt_signal_to_notice_activity": since(notice_scheduled),
            "notice_activity_to_notice_delivered": since(delivered, notice_scheduled or preempt),
            "notice_delivered_to_checkpoint_saved": None if save_s is None else round(save_s, 3),
            "to_ranks_gone_reported": since(ranks_ended, saved[saved_step] if saved_step is not None else delivered),
            "ranks_gone_to_release": since(release, ranks_ended or release),
            "release_to_preemptor_placed": since(preemptor_placed, release),
            # placement → the node agent's run_ranks activity started (a port reserved first) → the first step
            # (the ranks load the bundle, rendezvous, build the DDP model, load a checkpoint, take a step)
            "preemptor_placed_to_ranks_launched": since(preemptor_ranks_started, preemptor_placed or release),
            "preemptor_ranks_launched_to_first_step": since(preemptor_first, preemptor_ranks_started or release),
            "capacity_back_to_victim_placed": since(placed_again, capacity_back),
            "victim_placed_to_ranks_launched": since(ranks_started_again, placed_again or capacity_back),
            "victim_ranks_launched_to_first_resumed_step": since(resumed, ranks_started_again or capacity_back),
        },
    }


# ---------------------------------------------------------------------------------------------------------
# medians, goals, output
# ---------------------------------------------------------------------------------------------------------
FIGURES = (
    "notice_delivered_s",
    "save_s",
    "gpus_free_s",
    "preemptor_placed_s",
    "preemptor_first_step_s",
    "capacity_back_s",
    "resume_after_capacity_s",
    "notice_to_resume_s",
    "steps_lost",
    "step_period_s",
)


def _median(values: list[Any]) -> Any:
    import statistics

    vals = [v for v in values if v is not None]
    if not vals:
        return None
    m = statistics.median(vals)
    return round(m, 3) if isinstance(m, float) else m


def summarise(samples: dict[str, list[dict[str, Any]]], settings: dict[str, Any]) -> dict[str, Any]:
    """The JSON line's figures: medians per mode, the goals (cooperative mode) and the samples."""
    result: dict[str, Any] = {"benchmark": "preemption"}
    for mode in MODES:
        runs = samples[mode]
        entry = {key: _median([r[key] for r in runs]) for key in FIGURES}
        lost = [r["steps_lost"] for r in runs]
        entry["steps_lost_mean"] = round(sum(lost) / len(lost), 2)
        entry["steps_lost_max"] = max(lost)
        entry["from_standby"] = {
            "preemptor": sum(1 for r in runs if (r["preemptor_standby_age_s"] or 0) > 0),
            "resumed": sum(1 for r in runs if (r["resumed_standby_age_s"] or 0) > 0),
            "of": len(runs),
        }
        entry["breakdown_s"] = {k: _median([r["breakdown_s"][k] for r in runs]) for k in runs[0]["breakdown_s"]}
        result[mode] = entry

    coop = samples["cooperative"]
    save = _median([r["save_s"] or 0.0 for r in coop])  # a rank that saved nothing: no save time to allow

    def goal(key: str, limit: float, slack: bool) -> dict[str, Any]:
        """``key`` (cooperative) against ``limit``, plus the rep's own save time when ``slack``."""
        value = result["cooperative"][key]
        bound = round(save + limit, 3) if slack else limit
        per_rep = [r[key] is not None and r[key] <= ((r["save_s"] or 0.0) + limit if slack else limit) for r in coop]
        ok = value is not None and value <= bound
        return {"value": value, "limit": bound, "ok": bool(ok), "ok_every_rep": all(per_rep)}

    result["goals"] = {
        "gpus_free_le_save_plus_5s": goal("gpus_free_s", GOAL_FREE_SLACK_S, slack=True),
        "preemptor_first_step_le_save_plus_15s": goal("preemptor_first_step_s", GOAL_FIRST_STEP_SLACK_S, slack=True),
        "steps_lost_le_1": goal("steps_lost", GOAL_STEPS_LOST, slack=False),
    }
    result["settings"] = settings
    result["samples"] = samples
    return result


def command_line(result: dict[str, Any]) -> str:
    """The command that reproduces ``result``."""
    s = result["settings"]
    line = f"python tests/perf/bench_preemption.py --reps {s['reps']}"
    for key, default in DEFAULTS.items():
        if s[key] != default:
            line += f" --{key.replace('_', '-')} {s[key]:g}"
    return line + (" --no-warmup" if not s.get("warmup", True) else "")


def _s(value: Any) -> str:
    return "–" if value is None else f"{value:.2f} s"


def markdown(result: dict[str, Any]) -> list[str]:
    """The README's table, note and caption for one JSON line of this benchmark."""
    from benchenv import caption, markdown_table

    coop, kill, goals, s = result["cooperative"], result["kill"], result["goals"], result["settings"]
    every = s["checkpoint_every"]

    def pair(key: str) -> list[str]:
        return [_s(coop[key]), _s(kill[key])]

    rows = [
        ["notice → delivered to the ranks (notice file, SIGTERM)", *pair("notice_delivered_s"), ""],
        ["delivered → checkpoint saved: the save", _s(coop["save_s"]), "– (no save)", ""],
        [
            "notice → GPUs free (released to the Scheduler)",
            *pair("gpus_free_s"),
            f"≤ save + 5 s ({goals['gpus_free_le_save_plus_5s']['limit']:.2f} s)",
        ],
        [
            "notice → the preemptor's first step",
            *pair("preemptor_first_step_s"),
            f"≤ save + 15 s ({goals['preemptor_first_step_le_save_plus_15s']['limit']:.2f} s)",
        ],
        ["preemptor done (GPUs back) → the victim's first resumed step", *pair("resume_after_capacity_s"), ""],
        ["notice → the victim's first resumed step", *pair("notice_to_resume_s"), ""],
        [
            f"steps lost per preemption (checkpoint every {every} steps)",
            f"{coop['steps_lost']:g}",
            f"{kill['steps_lost']:g}",
            f"≤ {GOAL_STEPS_LOST}",
        ],
    ]
    header = [f"median of {s['reps']}", "cooperative (checkpoint at the notice)", "SIGTERM and kill (baseline)", "goal"]
    samples = result["samples"]

    def per_rep(mode: str) -> str:
        return ", ".join(str(r["steps_lost"]) for r in samples[mode])

    c_sb, k_sb = coop["from_standby"], kill["from_standby"]
    if all(sb[key] == sb["of"] for sb in (c_sb, k_sb) for key in ("preemptor", "resumed")):
        standby = (
            "The ranks of every preemptor and every resumed victim were the node agent's standby processes, "
            "started ahead to import torch."
        )
    else:
        standby = (
            f"The ranks of {c_sb['preemptor']} and {k_sb['preemptor']} of {c_sb['of']} preemptors and of "
            f"{c_sb['resumed']} and {k_sb['resumed']} of {c_sb['of']} resumed victims (cooperative, kill) were the "
            f"node agent's standby processes, started ahead to import torch; the others were spawned fresh."
        )
    met = [name for name, g in goals.items() if g["ok"] and g["ok_every_rep"]]
    missed = [name for name in goals if name not in met]
    note = (
        f"Steps lost per rep: cooperative {per_rep('cooperative')}; kill {per_rep('kill')} (mean "
        f"{kill['steps_lost_mean']:g}; half a checkpoint interval is {every / 2:g}). A step took "
        f"{coop['step_period_s']:.3f} s. {standby} Goals met in every rep: {', '.join(met) or 'none'}"
        + (f"; missed: {', '.join(missed)}." if missed else ".")
    )
    return [*markdown_table(header, "lrrr", rows), "", note, "", caption(command_line(result), result)]


def table(result: dict[str, Any]) -> list[str]:
    """The plain-text table printed to stderr."""

    def fmt(v: Any) -> str:
        return "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))

    s = result["settings"]
    lines = [f"preemption of a 2-rank DDP job ({s['reps']} rep(s), medians; s from the notice unless said)"]
    lines.append(f"  {'':<44}{'cooperative':>14}{'kill':>14}")
    for key in (*FIGURES, "steps_lost_mean", "steps_lost_max"):
        lines.append(f"  {key:<44}{fmt(result['cooperative'][key]):>14}{fmt(result['kill'][key]):>14}")
    lines.append("  where the time went:")
    for key in result["cooperative"]["breakdown_s"]:
        c, k = result["cooperative"]["breakdown_s"][key], result["kill"]["breakdown_s"][key]
        lines.append(f"    {key:<42}{fmt(c):>14}{fmt(k):>14}")
    lines.append("  goals (cooperative):")
    for name, g in result["goals"].items():
        verdict = "OK" if g["ok"] and g["ok_every_rep"] else "MISSED"
        lines.append(f"    {name:<42}{fmt(g['value']):>10} ≤ {fmt(g['limit']):<8} {verdict}")
    load = result["load"]
    lines.append(
        f"  (checkpoint every {s['checkpoint_every']} steps, {s['step_seconds']:g} s sleep per step, "
        f"{result['environment']['cores']} cores, load average {load['min']:.1f}–{load['max']:.1f})"
    )
    return lines


# ---------------------------------------------------------------------------------------------------------
# the stack and the runs
# ---------------------------------------------------------------------------------------------------------
def queue_config(grace: float) -> dict[str, Any]:
    """One tenant owning the node's 2 GPU slots; ``high`` preempts the tenant's own ``low`` gangs."""
    return {
        "tenants": [{"name": TENANT, "quota": {"gpu": GPUS}}],
        "priority_classes": [{"name": "low", "value": 10}, {"name": "high", "value": 100}],
        "policy": {"within_tenant": "lower_priority", "min_runtime": "1s", "preemption_grace": f"{grace:g}s"},
    }


def main(args: argparse.Namespace) -> None:
    import asyncio
    import contextlib
    import json
    import os
    import re
    import shutil
    import subprocess
    import sys
    import tempfile
    import time
    from pathlib import Path

    from benchenv import LoadSampler, emit, environment, log, render

    if args.render:
        render(args.render, "preemption", markdown)
        return

    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "examples"))
    import multitenant

    from engine.client import Client
    from engine.executor.process import spawn, stop_processes
    from engine.runtime import DevServer, Endpoint, connect

    scratch = Path(tempfile.mkdtemp(prefix="gangflow-bench-preemption-"))
    os.environ["GANGFLOW_CACHE"] = str(scratch / "client-cache")  # the client packs bundles here
    artifacts = scratch / "artifacts"
    node_cache = scratch / "node" / "cache"
    workdir_re = re.compile(r"\.a(\d+)\.n\d+$")
    procs: list[tuple[str, subprocess.Popen[bytes], Path]] = []

    def start(name: str, argv: list[str]) -> None:
        home = scratch / name
        home.mkdir(parents=True, exist_ok=True)
        logfile = home / f"{name}.log"
        env = dict(os.environ, GANGFLOW_CACHE=str(home / "cache"), PYTHONUNBUFFERED="1", TMPDIR=str(home))
        procs.append(
            (
                name,
                spawn([sys.executable, "-m", "engine.cli", *argv], log=logfile, env=env, cwd=home, new_session=True),
                logfile,
            )
        )

    def check_alive() -> None:
        for name, proc, logfile in procs:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{name} exited with {proc.returncode}:\n{logfile.read_text(errors='replace')[-3000:]}"
                )

    async def until(what: str, probe: Any, timeout: float = PHASE_TIMEOUT_S) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            check_alive()
            with contextlib.suppress(Exception):
                value = await probe()
                if value:
                    return value
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: not within {timeout:g} s")
            await asyncio.sleep(0.05)

    boot = time.time() - float(Path("/proc/uptime").read_text().split()[0])
    clock_ticks = os.sysconf("SC_CLK_TCK")

    def created(pid: int) -> float | None:
        """When process ``pid`` was created (±10 ms), or None when it is gone (Linux)."""
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        return boot + int(stat[stat.rindex(")") + 2 :].split()[19]) / clock_ticks  # field 22, starttime

    def scan(obs: Observed, gangs: dict[str, str], checkpoint_dir: Path) -> None:
        """The ranks' progress files, the victim's notice file and checkpoints (node agent's layout:
        <cache>/nodes/<node>/<gang>.a<A>.n<N>/{progress/rank<r>.json,notice.json})."""
        for who, gang_id in gangs.items():
            for work in node_cache.glob(f"nodes/*/{gang_id}.a*.n*"):
                found = workdir_re.search(work.name)
                if not found:
                    continue
                attempt = int(found.group(1))
                for path in work.glob("progress/rank*.json"):
                    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                        record = json.loads(path.read_text())
                        rank = int(path.stem.removeprefix("rank"))
                        obs.add_report(who, attempt, rank, int(record["step"]), float(record["time"]))
                        if (who, attempt, rank) not in obs.proc_start and (born := created(int(record["pid"]))):
                            obs.proc_start[(who, attempt, rank)] = born
                if who == "victim" and attempt == 0 and obs.notice_t is None:
                    with contextlib.suppress(OSError):
                        obs.notice_t = (work / "notice.json").stat().st_mtime
        with contextlib.suppress(OSError):
            for path in checkpoint_dir.iterdir():
                step = re.match(r"^step-(\d+)\.ckpt$", path.name)
                if step and int(step.group(1)) not in obs.checkpoints:
                    with contextlib.suppress(OSError):
                        obs.checkpoints[int(step.group(1))] = path.stat().st_mtime

    async def history(client: Client, workflow_id: str) -> list[Event]:
        from temporalio.api.enums.v1 import EventType

        scheduled: dict[int, str] = {}
        events: list[Event] = []
        async for event in client.temporal.get_workflow_handle(workflow_id).fetch_history_events():
            kind = str(EventType.Name(event.event_type)).removeprefix("EVENT_TYPE_")
            detail = ""
            if kind == "ACTIVITY_TASK_SCHEDULED":
                detail = event.activity_task_scheduled_event_attributes.activity_type.name
                scheduled[int(event.event_id)] = detail
            elif kind.startswith("ACTIVITY_TASK_"):
                attrs = getattr(event, f"{kind.lower()}_event_attributes", None)
                detail = scheduled.get(int(getattr(attrs, "scheduled_event_id", 0)), "")
            elif kind == "WORKFLOW_EXECUTION_SIGNALED":
                detail = event.workflow_execution_signaled_event_attributes.signal_name
            elif kind == "SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED":
                detail = event.signal_external_workflow_execution_initiated_event_attributes.signal_name
            stamp = event.event_time.seconds + event.event_time.nanos / 1e9
            events.append((stamp, kind, detail))
        return events

    def inputs(steps: int, cooperate: bool, every: int | None = None) -> dict[str, Any]:
        return {
            "steps": steps,
            "checkpoint_every": every or args.checkpoint_every,
            "step_seconds": args.step_seconds,
            "cooperate": cooperate,
        }

    async def one(client: Client, mode: str, trigger: int) -> dict[str, Any]:
        victim_run = await client.start(
            multitenant.pipeline, inputs(args.steps, mode == "cooperative"), tenant=TENANT, priority="low"
        )
        obs = Observed(mode=mode, trigger_step=trigger, victim_run=victim_run, preemptor_run="")
        gangs = {"victim": f"{victim_run}.{TASK_CALL}"}
        checkpoint_dir = artifacts / "checkpoints" / victim_run / TASK_CALL

        async def watch() -> None:
            while True:
                scan(obs, gangs, checkpoint_dir)
                await asyncio.sleep(0.05)

        watcher = asyncio.create_task(watch())
        try:

            async def at_trigger() -> bool:
                latest = [max(r) for (w, a, _), r in obs.reports.items() if (w, a) == ("victim", 0) and r]
                return len(latest) == 2 and min(latest) >= trigger

            await until(f"{mode}: the victim at step {trigger}", at_trigger)
            obs.preemptor_run = await client.start(
                multitenant.pipeline,
                inputs(args.preemptor_steps, True, every=args.preemptor_steps),
                tenant=TENANT,
                priority="high",
            )
            gangs["preemptor"] = f"{obs.preemptor_run}.{TASK_CALL}"
            await asyncio.wait_for(client.result(obs.preemptor_run, multitenant.pipeline), PHASE_TIMEOUT_S)
            trained = await asyncio.wait_for(client.result(victim_run, multitenant.pipeline), PHASE_TIMEOUT_S)
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        obs.first_step, obs.attempt = int(trained.first_step), int(trained.attempt)
        obs.optimizer_steps, obs.steps = int(trained.optimizer_steps), int(trained.steps)
        info = await client.gang(gangs["victim"])
        obs.preemptions, obs.restarts = int(info.get("preemptions") or 0), int(info.get("restarts") or 0)
        obs.failed_attempts = [
            {**a, "reason": str(a.get("reason", "")).splitlines()[0][:200]} for a in info.get("failed_attempts") or []
        ]
        obs.victim_events = await history(client, gangs["victim"])
        obs.preemptor_events = await history(client, gangs["preemptor"])
        return analyse(obs)

    async def run_all() -> dict[str, list[dict[str, Any]]]:
        server = DevServer(scratch / "temporal", ui=False)
        await asyncio.to_thread(server.start)
        try:
            start("worker", ["worker", "--address", server.address])
            node = ["node", "--node-id", NODE_ID, "--gpus", str(GPUS), "--cpus", "4"]
            start("node", [*node, "--address", server.address, "--advertise-addr", "127.0.0.1"])
            client = Client(await connect(Endpoint.resolve(server.address)), artifacts=str(artifacts))

            async def registered() -> bool:
                return int((await client.queue())["totals"]["alive_nodes"]) >= 1

            await until("the node agent registered", registered, 90)
            await client.apply_queues(queue_config(args.grace))
            log(f"stack up on {server.address}: node {NODE_ID} with {GPUS} GPU slots; {vars(args)}")
            if not args.no_warmup:
                t0 = time.monotonic()
                warm = await client.start(multitenant.pipeline, inputs(5, True), tenant=TENANT, priority="low")
                await asyncio.wait_for(client.result(warm, multitenant.pipeline), PHASE_TIMEOUT_S)
                log(f"  warm-up (not counted): {time.monotonic() - t0:.1f} s")
            samples: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
            for i, trigger in enumerate(trigger_steps(args.reps, args.checkpoint_every, args.preempt_from)):
                for mode in MODES if i % 2 == 0 else MODES[::-1]:
                    sample = await one(client, mode, trigger)
                    samples[mode].append(sample)
                    log(
                        f"  rep {i + 1}/{args.reps} {mode:<11} trigger {trigger}: delivered "
                        f"{sample['notice_delivered_s']} s, save {sample['save_s']} s, GPUs free "
                        f"{sample['gpus_free_s']} s, preemptor's first step {sample['preemptor_first_step_s']} s, "
                        f"resumed {sample['resume_after_capacity_s']} s after capacity back; reached step "
                        f"{sample['reached_step']}, resumed from {sample['resumed_from_step']}: "
                        f"{sample['steps_lost']} lost; standby age of the preemptor's ranks "
                        f"{sample['preemptor_standby_age_s']} s, of the resumed ones "
                        f"{sample['resumed_standby_age_s']} s"
                    )
            return samples
        finally:
            stop_processes([proc for _n, proc, _l in reversed(procs)], 30, group=True)
            await asyncio.to_thread(server.stop)

    try:
        with LoadSampler() as load:
            samples = asyncio.run(run_all())
    finally:
        if args.keep:
            log(f"scratch kept: {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)

    settings = {
        "reps": args.reps,
        **{key: getattr(args, key) for key in DEFAULTS},
        "warmup": not args.no_warmup,
        "trigger_steps": trigger_steps(args.reps, args.checkpoint_every, args.preempt_from),
        "nodes": f"1 node agent with {GPUS} GPU slots (ranks on CPU, gloo), its default warm standby",
        "task": "examples/multitenant.py:train, PyTorch(nnodes=1, nproc_per_node=2)",
    }
    result = summarise(samples, settings)
    result.update(environment=environment(), load=load.summary())
    emit(result, markdown(result) if args.markdown else table(result))


if __name__ == "__main__":
    import os
    import sys

    _args = parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main(_args)
