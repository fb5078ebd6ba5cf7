"""What the block-wise repair needs before its first step (``repair.py``): a student layer to
repair, and from a teacher cache the teacher states each repaired layer reads; and at each step,
a finite loss."""

from __future__ import annotations

from lightning_kd.utils.refusal import Refused


def check_plan(distiller, spans: list, frozen: list[str]) -> None:
    """Refuse a repair of no layer (``frozen``: the layers standing for several teacher layers
    that ``student.freeze_layers`` keeps as copied), and one whose cache lacks its states."""
    if not spans:
        raise Refused(nothing_to_repair(frozen))
    check_cached_states(distiller, spans)


def nothing_to_repair(frozen: list[str]) -> str:
    """Why a repair would train no layer, and the fix. It ran 0 passes of 0 layers without a
    word, and ``distill.teacher_cache=auto`` counted its passes as teacher reads: a cache was
    written, and the KD term trained from it, for a repair that never read one (probe 55)."""
    if frozen:
        return (
            f"distill.blockwise_passes: no student layer to repair: {frozen} each stand for "
            "several teacher layers but are frozen (student.freeze_layers), and the others copy "
            "one teacher layer as it is; set distill.blockwise_passes=0, or freeze fewer layers"
        )
    return (
        "distill.blockwise_passes: no student layer to repair: each copies one teacher layer as "
        "it is, none stands for several; set distill.blockwise_passes=0"
    )


def check_cached_states(distiller, spans: list) -> None:
    """From a teacher cache, the repair reads the states it stores: refuse one without them
    (written for a resume, or with cache.keep_repair_states=false after its run) before any
    step, naming the fix."""
    cache = distiller.cached_teacher
    if cache is None or distiller.repair_source is not None:  # the source runs itself
        return
    needed = {path for span in spans for path in (span.source, span.target) if path}
    lacking = sorted(needed - set(cache.key.features))
    if lacking:
        raise ValueError(
            f"distill.blockwise_passes reads the teacher's outputs of {lacking}, which the "
            f"teacher cache in {cache.cache.directory} does not hold; use a cache written for "
            "this repair (distill.teacher_cache=auto writes one), or set "
            "distill.blockwise_passes=0"
        )


class RepairDiverged(Refused):
    """A repair step whose loss is NaN or infinite: its layers diverged."""


def diverged(at: int, lr: float, spans: list) -> RepairDiverged:
    """The refusal of repair step ``at``'s non-finite loss, naming the repair's own rate. The
    repair went on to its end (``nan→nan``) and said it was done; training then failed at its
    first step and blamed ``optimizer.lr``, printing a command that failed the same way
    (probe 59)."""
    layers = ", ".join(span.student for span in spans)
    return RepairDiverged(
        f"the block-wise repair's loss is not finite at repair step {at} (layers {layers}): "
        f"they diverged at distill.blockwise_lr={lr:g}, and the student was not trained. "
        f"Lower distill.blockwise_lr (e.g. {lr / 10:g}), or set distill.blockwise_passes=0"
    )
