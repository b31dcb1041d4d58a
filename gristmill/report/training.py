"""``gristmill report RUN_DIR``: one training run, from its files (a local run dir, or the checkpoint dir
on an object store, where the trainer uploads metrics.jsonl beside the checkpoints).

``metrics.jsonl`` (the trainer's per-step log: loss, tokens/s, MFU, input wait, every rank's
step time; ``eval`` and ``checkpoint`` records), each checkpoint's ``meta.json`` (save time,
tokens seen) and, through the audit's own functions (``gristmill.audit``), what the model saw
per source and per language, exactly, from the newest checkpoint and its manifest.
"""
from __future__ import annotations

import json
import os

import numpy as np

from gristmill.errors import UsageError
from gristmill.manifests.storage import LocalStore, Store, local_path

from .page import Figure, Note, Page, Table, plot

METRICS_FILE = "metrics.jsonl"


def locate(target: str, options: dict | None = None) -> tuple[Store, str, str]:
    """(store, metrics.jsonl, checkpoint dir) of a run: a local run dir (``<run>/metrics.jsonl``,
    ``<run>/checkpoints``), or a checkpoint dir on any store (``s3://bucket/run/checkpoints``, opened
    with the storage ``options``), beside which the trainer uploads the run's logs."""
    local = local_path(target)
    if local is not None:
        return LocalStore(), os.path.join(local, METRICS_FILE), os.path.join(local, "checkpoints")
    store = Store.from_url(target, **(options or {}))
    target = target.rstrip("/")
    return store, store.join(target, METRICS_FILE), target


def is_run_dir(path: str, options: dict | None = None) -> bool:
    store, metrics, ckpts = locate(path, options)
    if store.is_local:
        return os.path.isdir(path) and (os.path.exists(metrics) or os.path.isdir(ckpts))
    return store.exists(metrics) or store.isdir(ckpts)


def read_metrics(run_dir: str, options: dict | None = None) -> dict[str, list[dict]]:
    """Records by kind; a resumed run appends, so the last record of a (kind, step) wins."""
    last: dict[tuple[str, int], dict] = {}
    store, path, _ = locate(run_dir, options)
    try:
        lines = store.read(path).decode().splitlines()
    except FileNotFoundError:
        lines = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except ValueError:
            raise UsageError(f"{path}:{n}: not a JSON line; the trainer writes one JSON object a line") from None
        last[(r.get("kind", "train"), int(r.get("step", 0)))] = r
    out: dict[str, list[dict]] = {"train": [], "eval": [], "checkpoint": []}
    for (kind, _), r in sorted(last.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        out.setdefault(kind, []).append(r)
    return out


def checkpoints(run_dir: str, options: dict | None = None) -> list[dict]:
    """Every committed checkpoint's meta.json (trainer.meta's reader), by step."""
    from gristmill.trainer.meta import META_FILE, STEP_DIR, read_meta

    store, _, root = locate(run_dir, options)
    try:
        names = store.listdir(root)
    except (FileNotFoundError, NotADirectoryError):
        names = []
    out = [read_meta(store.join(root, d), store) for d in names
           if STEP_DIR.match(d) and store.exists(store.join(root, d, META_FILE))]
    return sorted(out, key=lambda m: m["step"])


def newest_checkpoint(run_dir: str, options: dict | None = None) -> tuple[tuple | None, str | None]:
    """((newest checkpoint, its data), None) as the audit opens them, or (None, why not); the
    checkpoint's and the data's stores opened with the storage ``options``. Read once a page: the
    summary and the spikes' documents both start from it."""
    from gristmill.audit import open_manifest, read_checkpoint
    from gristmill.errors import GristmillError

    try:
        ckpt = read_checkpoint(run_dir, options)
        return (ckpt, open_manifest(ckpt, storage_options=options)), None
    except GristmillError as e:
        return None, str(e)


def seen(opened: tuple | None, why: str | None) -> tuple[dict | None, str | None]:
    """The audit's summary for the newest checkpoint (``gristmill audit seen --json``), or why not."""
    from gristmill.audit import audit_seen, consumed, parse_steps
    from gristmill.errors import GristmillError

    if opened is None:
        return None, why
    ckpt, published = opened
    try:
        steps = parse_steps(None, ckpt)
        return audit_seen(published, consumed(published.manifest, ckpt, steps), steps).summary, None
    except GristmillError as e:
        return None, str(e)


def run_page(run_dir: str, options: dict | None = None) -> Page:
    """The page of a training run, its stores (checkpoints, data) opened with the storage ``options``."""
    if not is_run_dir(run_dir, options):
        raise UsageError(f"{run_dir}: not a training run dir (no {METRICS_FILE} nor checkpoints/)")
    rec = read_metrics(run_dir, options)
    train, evals, saves = rec["train"], rec["eval"], rec["checkpoint"]
    metas = checkpoints(run_dir, options)
    opened, why_not = newest_checkpoint(run_dir, options)
    summary, why = seen(opened, why_not)
    last = train[-1] if train else {}
    where = os.path.abspath(run_dir) if local_path(run_dir) is not None else run_dir
    page = Page(title=f"training run {os.path.basename(where.rstrip('/'))}",
                subtitle=f"{where}" + (f" - data {summary['dataset']} v{summary['version']}" if summary else ""),
                totals=[("steps", "last logged step", last.get("step")), ("tokens_seen", "tokens trained", last.get("tokens_seen")),
                        ("loss", "last loss", round(last["loss"], 4) if "loss" in last else None),
                        ("val_loss", "last validation loss", round(evals[-1]["val_loss"], 4) if evals else None),
                        ("checkpoints", "checkpoints", len(metas))])
    if summary:
        page.totals += [("documents_seen", "documents seen", summary["documents_seen"]),
                        ("manifest_sha256", "manifest sha256", summary["manifest_sha256"])]
    loss_section(page, train, evals)
    # a skipped step read between records (log_every > 1) has a record of its own without timings
    timed = [r for r in train if "step_s" in r]
    speed_section(page, timed)
    ranks_section(page, timed, rec.get("straggler", []))
    checkpoint_section(page, saves, metas, timed)
    spikes_section(page, rec.get("spike", []), run_dir, opened, why_not)
    seen_section(page, summary, why)
    return page


def loss_section(page: Page, train: list[dict], evals: list[dict]) -> None:
    sec = page.section("loss", "Loss")
    if not train:
        sec.add(Note(f"No train record in {METRICS_FILE}.", missing=True))
        return
    series = {"train loss": ([r["step"] for r in train], [r["loss"] for r in train])}
    if evals:
        series["validation loss"] = ([r["step"] for r in evals], [r["val_loss"] for r in evals])
    rows = {r["step"]: [r["step"], r["loss"], None, r.get("grad_norm"), r.get("lr")] for r in train}
    for r in evals:
        rows.setdefault(r["step"], [r["step"], None, None, None, None])[2] = r["val_loss"]
    sec.add(Figure("loss", "Training and validation loss", lambda: plot().lines(series, xlabel="step", ylabel="loss",
                                                                               markers=len(train) < 60),
                   Table(["step", "loss", "validation loss", "grad norm", "lr"], [rows[k] for k in sorted(rows)])))
    if not evals:
        sec.add(Note("No validation loss: the run's eval.every is 0.", missing=True))


def speed_section(page: Page, train: list[dict]) -> None:
    if not train:
        return
    sec = page.section("speed", "Throughput, MFU and input wait")
    steps = [r["step"] for r in train]
    tps = [r["tokens_per_s"] for r in train]
    wait = [r["input_wait_pct"] for r in train]
    sec.add(Figure("tokens_per_s", "Tokens per second (all ranks)",
                   lambda: plot().lines({"tokens/s": (steps, tps)}, xlabel="step", ylabel="tokens/s"),
                   Table(["step", "tokens/s", "tokens/s per device", "step s"],
                         [[r["step"], r["tokens_per_s"], r.get("tokens_per_s_per_device"), r.get("step_s")] for r in train])),
            Figure("input_wait", "Input wait: share of each step spent waiting for the loader",
                   lambda: plot().lines({"input wait %": (steps, wait)}, xlabel="step", ylabel="% of step"),
                   Table(["step", "input wait %", "input wait s"], [[r["step"], r["input_wait_pct"], r.get("input_wait_s")]
                                                                    for r in train]),
                   caption=f"median {np.median(wait):.1f}% (the first step also waits for the first batch)"))
    mfu = [(r["step"], r["mfu"]) for r in train if r.get("mfu") is not None]
    if mfu:
        sec.add(Figure("mfu", "Model FLOPs utilisation (dense bf16 peak of the device)",
                       lambda: plot().lines({"MFU %": ([s for s, _ in mfu], [100 * v for _, v in mfu])}, xlabel="step",
                                            ylabel="% of peak"),
                       Table(["step", "MFU"], [list(x) for x in mfu])))
    else:
        sec.add(Note("MFU: not reported: the device's peak FLOP/s is not in trainer.metrics.PEAK_BF16_FLOPS (a CPU run, "
                     "or hardware not in the table).", missing=True))


def rank_series(per: list[dict], key: str, world: int) -> dict[str, tuple[list, list]]:
    """One line per rank of a per-rank list field (``rank_step_s``, ``rank_input_wait_s``, ...)."""
    return {f"rank {k}": ([r["step"] for r in per if len(r.get(key) or []) > k],
                          [r[key][k] for r in per if len(r.get(key) or []) > k]) for k in range(world)}


def ranks_section(page: Page, train: list[dict], stragglers: list[dict]) -> None:
    """Every rank's input wait and step time (means per step over each record's window, see
    docs/trainer.md), its wait in the step's first collective, and the straggler rule's findings."""
    per = [r for r in train if r.get("rank_step_s")]
    if not per:
        return
    sec = page.section("ranks", "Every rank: input wait and step time")
    world = max(len(r["rank_step_s"]) for r in per)
    series = rank_series(per, "rank_step_s", world)
    rows = []
    for k in range(world):
        own = np.array(series[f"rank {k}"][1])
        # a straggler: slower than the step's fastest rank, step after step
        slower = np.array([r["rank_step_s"][k] / min(r["rank_step_s"]) for r in per if len(r["rank_step_s"]) > k])
        rows.append([k, float(np.median(own)), float(own.max()), round(float(np.median(slower)), 3)])
    sec.add(Figure("rank_step_s", "Each rank's step time (a straggler is the line above the others)",
                   lambda: plot().lines(series, xlabel="step", ylabel="seconds"),
                   Table(["rank", "median step s", "max step s", "median x fastest rank"], rows),
                   caption=f"{world} rank(s)"))
    for key, name, title in (("rank_input_wait_s", "rank_input_wait_s", "Each rank's input wait per step "
                              "(a slow data path shows here, on its own rank)"),
                             ("rank_collective_wait_s", "rank_collective_wait_s", "Each rank's wait in the step's "
                              "first collective (the others wait here for a straggler)")):
        lines = rank_series(per, key, world)
        if not any(xs for xs, _ in lines.values()):
            continue
        sec.add(Figure(name, title, lambda lines=lines: plot().lines(lines, xlabel="step", ylabel="seconds"),
                       Table(["rank", "median s", "max s"],
                             [[k, float(np.median(ys)), float(np.max(ys))] for k, (_, ys) in
                              enumerate(lines.values()) if ys])))
    if stragglers:
        sec.add(Table(["step", "rank", "host", "own step s", "median rank's s", "windows in a row"],
                      [[r["step"], r["rank"], r.get("host"), r.get("own_step_s"), r.get("median_own_step_s"),
                        r.get("windows")] for r in stragglers],
                      caption="stragglers named by the rule (run.straggler_fraction, run.straggler_windows)"))


def checkpoint_section(page: Page, saves: list[dict], metas: list[dict], train: list[dict]) -> None:
    sec = page.section("checkpoints", "Checkpoints")
    if not saves and not metas:
        sec.add(Note("No checkpoint was written (checkpoint.enabled false, or the run stopped first).", missing=True))
        return
    if saves:
        sec.add(Figure("checkpoint_save_s", "Time training was blocked by each save",
                       lambda: plot().bars([str(r["step"]) for r in saves], {"blocked s": [r["blocked_s"] for r in saves]},
                                           xlabel="seconds", horizontal=False),
                       Table(["step", "blocked s", "Young/Daly interval s"],
                             [[r["step"], r["blocked_s"], r.get("young_daly_interval_s")] for r in saves])))
        step_s = float(np.median([r["step_s"] for r in train])) if train else None
        sec.add(cadence_note(saves[-1], saves, step_s))
    if metas:
        sec.add(Table(["checkpoint", "created (UTC)", "save s", "tokens seen", "world size", "manifest sha256"],
                      [[f"step-{m['step']}", m.get("created_at"), m.get("save_seconds"), m.get("tokens_seen"),
                        m.get("world_size"), m["data"]["manifest_sha256"][:16]] for m in metas],
                      caption="committed checkpoints (meta.json); older ones were removed by checkpoint.keep"))
        record = metas[-1].get("run_record")
        if record:
            sec.add(Table(["run record", "value"], [[k, ", ".join(v) if isinstance(v, list) else v]
                                                    for k, v in sorted(record.items())],
                          caption=f"what ran the job (meta.json run_record of step-{metas[-1]['step']}): tokenizer, "
                                  f"device, CUDA / driver / NCCL versions, container image digest, every rank's host"))


def cadence_note(last: dict, saves: list[dict], step_s: float | None) -> Note:
    """Young/Daly for the last save's measured cost, and the expected waste (saves + recomputation after a
    failure) of the cadence the run used and of the other (the configured fixed interval, or Young/Daly's)."""
    every = np.diff([0] + [r["step"] for r in saves])
    used = f"this run saved every {int(np.median(every))} steps" + (
        f" ({np.median(every) * step_s:,.1f} s)" if step_s else "")
    if "waste_young_daly" not in last:  # a record of a trainer before the auto cadence
        yd = last.get("young_daly_interval_s")
        return Note(f"Young/Daly: checkpoint every {yd:,.0f} s for the last save's cost ({last['blocked_s']:.3f} s); "
                    f"{used}." if yd else f"{used}.")
    yd, fixed = last["waste_young_daly"], last.get("waste_fixed")
    text = (f"Young/Daly for the measured save cost ({last['save_cost_s']:.3f} s blocked, the median of the saves) and "
            f"the job's MTBF ({last['mtbf_s'] / 3600:,.1f} h): every {last['young_daly_interval_s']:,.0f} s = "
            f"{last['young_daly_every']:,} steps, expected waste {yd['total_pct']:.2f}% of the wall time "
            f"({yd['saves_pct']:.2f}% to saves + {yd['recompute_pct']:.2f}% recomputing after a failure)")
    if last.get("every") == "auto":
        text += "; checkpoint.every=auto used it"
    elif fixed:
        text += (f"; the configured checkpoint.every={last['every']}: expected waste {fixed['total_pct']:.2f}% "
                 f"({fixed['saves_pct']:.2f}% + {fixed['recompute_pct']:.2f}%)")
    return Note(f"{text}; {used}.")


def spikes_section(page: Page, spikes: list[dict], run_dir: str, opened: tuple | None, why: str | None) -> None:
    """The loss spikes the trainer's detector logged (spikes: section) and, from the newest checkpoint
    (``newest_checkpoint``), the documents of each spike's window (``gristmill audit steps``), skipped
    ones flagged."""
    if not spikes:
        return
    from gristmill.audit.steps import audit_steps

    sec = page.section("spikes", "Loss spikes and the documents behind them")
    sec.add(Table(["step", "metric", "value", "running mean", "spreads above", "action"],
                  [[r["step"], r["metric"], r["value"], r["mean"], round(r["z"], 1), r["action"]] for r in spikes]))
    if opened is None:
        sec.add(Note(f"The audit could not list the spikes' documents: {why}", missing=True))
        return
    ckpt, published = opened
    for r in spikes[:5]:
        window = (max(ckpt.first_step, r["step"] - 2), r["step"])
        if window[1] > ckpt.step:
            sec.add(Note(f"Spike at step {r['step']}: after the newest checkpoint (step {ckpt.step}).", missing=True))
            continue
        docs = sorted(audit_steps(published, ckpt, window).documents.to_pylist(),
                      key=lambda d: (not d["skipped"], -d["tokens_in_steps"], d["doc_id"]))
        sec.add(Table(["document", "steps", "tokens here", "seen before", "source", "url", "skipped"],
                      [[d["doc_id"], f"{d['first_step']}:{d['last_step']}", d["tokens_in_steps"], d["seen_before"],
                        d["source"], d.get("url"), "; ".join(d["skipped"])] for d in docs[:20]],
                      caption=f"steps {window[0]}:{window[1]}, skipped first, then most tokens (all of them: gristmill audit steps "
                              f"{run_dir} --steps {window[0]}:{window[1]})"))


def seen_section(page: Page, summary: dict | None, why: str | None) -> None:
    sec = page.section("seen", "What the model saw")
    if summary is None:
        sec.add(Note(f"The audit could not answer: {why}", missing=True))
        return
    sec.add(Note(f"From the newest checkpoint, exactly (gristmill audit seen): steps {summary['steps'][0]}:"
                 f"{summary['steps'][1]}, {summary['samples']:,} samples, {summary['tokens_seen']:,} distinct tokens "
                 f"({summary['token_exposures']:,} with repeats), {summary['documents_seen']:,} documents "
                 f"({summary['documents_fully_seen']:,} fully)."))
    for key, name, title in (("by_source", "seen_per_source", "source (the job's inputs[].path)"),
                             ("by_lang", "seen_per_language", "language"), ("by_file", "seen_per_file", "input file")):
        entries = sorted(summary[key].items(), key=lambda kv: (-kv[1]["tokens_seen"], kv[0]))
        shown = entries[:30]
        sec.add(Figure(name, f"Tokens seen per {title}",
                       lambda shown=shown: plot().bars([k.rsplit("/", 1)[-1] for k, _ in shown],
                                                       {"tokens seen": [v["tokens_seen"] for _, v in shown]},
                                                       xlabel="tokens"),
                       Table([title.split(" (")[0], "documents", "fully seen", "tokens seen", "token exposures"],
                             [[k, v["documents"], v["fully_seen"], v["tokens_seen"], v["token_exposures"]]
                              for k, v in entries])))
