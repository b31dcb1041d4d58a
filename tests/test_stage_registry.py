"""``pipeline.stages.STAGES`` is the one order: everything that names stages agrees with it."""
import importlib
import types
import typing

import pytest

from gristmill.pipeline import stages
from gristmill.pipeline.config import PrepareConfig
from gristmill.pipeline.stages import STAGE_ORDER, STAGES, Stage


def _job(tmp_path, **sections):
    return PrepareConfig.from_dict({"inputs": ["unused.jsonl"], "output": {"store": str(tmp_path / "s"), "dataset": "d"},
                                    "work_dir": str(tmp_path / "w"), **sections})


def test_names_are_unique_and_the_order_is_derived_from_stages():
    names = [cls.name for cls in STAGES]
    assert len(set(names)) == len(names)
    assert STAGE_ORDER == tuple(n for cls in STAGES for n in cls.names)
    assert len(set(STAGE_ORDER)) == len(STAGE_ORDER)
    assert all(cls.names[0] == cls.name for cls in STAGES)


@pytest.mark.parametrize("cls", STAGES, ids=lambda c: c.name)
def test_a_stage_section_is_a_job_field_of_its_declared_type(cls):
    assert issubclass(cls, Stage) and "run" in vars(cls)
    if cls.section is None:
        assert cls.config is None
        return
    field = PrepareConfig.model_fields[cls.section]
    optional = typing.get_origin(field.annotation) in (typing.Union, types.UnionType)
    declared = {a for a in typing.get_args(field.annotation) if a is not type(None)} if optional else {field.annotation}
    assert cls.config in declared, f"{cls.name}: job.{cls.section} is {field.annotation}, not {cls.config}"


def test_the_stage_sections_of_the_job_come_in_stage_order():
    fields = list(PrepareConfig.model_fields)
    sections = list(dict.fromkeys(cls.section for cls in STAGES if cls.section))
    assert sorted(sections, key=fields.index) == sections


@pytest.mark.parametrize("module", ["extract", "unique_ids", "exact_dedup", "quality.task", "near_duplicates",
                                    "dedup_against", "decontam", "dedup_index", "pii", "tokenization"])
def test_a_library_stage_name_is_a_stage_name(module):
    lib = importlib.import_module(f"gristmill.pipeline.{module}")
    assert lib.STAGE in [cls.name for cls in STAGES]


def test_the_reports_own_stage_sections_name_stages():
    from gristmill.report.dataset import OWN_SECTIONS

    assert set(OWN_SECTIONS) <= set(STAGE_ORDER)


def test_build_is_stages_filtered_by_from_job(tmp_path):
    every = _job(tmp_path, inputs=[{"path": "unused.jsonl", "id_field": "id"}], quality={}, fuzzy_dedup={},
                 decontaminate={"enabled": False}, dedup_against=[str(tmp_path / "s" / "old" / "v1")])
    assert [s.name for s in stages.build(every)] == [n for n in STAGE_ORDER if n not in ("language", "decontaminate")]
    least = _job(tmp_path, exact_dedup={"enabled": False}, pii={"enabled": False})
    assert [s.name for s in stages.build(least)] == ["extract", "dedup_index", "tokenizer", "tokenize", "pack"]


def test_survivors_advance_from_the_declarations(tmp_path):
    from gristmill.pipeline.survivors import Survivors, Verdicts
    from gristmill.pipeline.workdir import WorkDir

    job = _job(tmp_path, quality={}, fuzzy_dedup={}, split={"validation_fraction": 0.1},
               decontaminate={"eval_sets": [], "against_validation": True})
    s = Survivors(WorkDir(str(tmp_path / "w")))
    for stage in stages.build(job):
        s = s.applying(stage.name, stage.verdicts())
    assert s.removed == (("exact_dedup", ""), ("quality", ""), ("fuzzy_dedup", ""), ("decontaminate", ""),
                         ("decontaminate", "val-"))
    assert s.overrides == (("quality", ""), ("decontaminate", ""), ("decontaminate", "val-"), ("pii", ""))
    assert Verdicts(removed=True, stage="language", applied=False) in stages.Extract.from_job(job).verdicts()


def test_an_artifact_is_looked_up_by_its_type(tmp_path):
    from gristmill.pipeline.runner import SerialRunner
    from gristmill.pipeline.stages.tokenizer import TokenizerFile
    from gristmill.pipeline.workdir import WorkDir

    wd = WorkDir(str(tmp_path / "w"))
    ctx = stages.Context(wd, SerialRunner(wd), [])

    class Hands(Stage):
        name = "hands"

        def run(self, ctx):
            return stages.StageResult(self.name, artifact=TokenizerFile("t.json"))

    with pytest.raises(RuntimeError, match="no earlier stage handed on a TokenizerFile"):
        ctx.artifact(TokenizerFile)
    ctx.run(Hands())
    assert ctx.artifact(TokenizerFile) == TokenizerFile("t.json")
    with pytest.raises(RuntimeError, match="already handed on"):
        ctx.run(Hands())
