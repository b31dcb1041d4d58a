"""``gristmill mix MIX.yaml``: publish a mixture of dataset versions pinned by hash (manifests/mix_config.py)."""
from __future__ import annotations

from .common import add_job_arguments, load_job


def register(sub) -> None:
    p = sub.add_parser("mix", help="publish a mixture of dataset versions (pinned by sha256) with weights or token budgets")
    add_job_arguments(p, "mixture job YAML (see docs/mixtures.md)")
    p.set_defaults(handler=_mix)


def _mix(args) -> int:
    from gristmill.manifests.mix_config import load, mix

    job = load_job(args, load)
    if job is None:
        return 0
    pub = mix(job, source=args.job)
    m = pub.manifest
    print(f"published mixture {m.name} v{m.version}: {pub.url}")
    print(f"sha256 {m.sha256}")
    for line in component_lines(m):
        print(line)
    for o in m.split_overlaps:  # published because the job allowed it: say so where it is seen
        print(f"split overlap (allow_split_overlap: true): {o['documents']:,} of {o['validation']!r}'s {o['of']:,} "
              f"validation documents are in {o['training']!r}'s training split")
    return 0


def component_lines(m) -> list[str]:
    """One line per component of a ``MixtureManifest``: its share, weight or budget, policy and pinned dataset."""
    out = []
    for c in m.components:
        how = f"budget {c.tokens:,} tokens ({c.budget_samples:,} samples)" if c.tokens is not None else f"weight {c.weight:g}"
        version = m.locations.get(c.name, {}).get("version")
        out.append(f"  {c.name:<20} {c.parts}/{m.period} = {c.parts / m.period:.1%} of samples ({how}, exhausted: "
                   f"{c.exhausted})  {c.dataset}{f' v{version}' if version else ''} {c.sha256[:16]}…  "
                   f"{c.train_rows:,} train rows ({c.train_rows * m.seq_len:,} tokens)")
    return out
