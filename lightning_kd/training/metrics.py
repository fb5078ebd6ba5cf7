"""Token-weighted validation metrics that reduce correctly across ranks.

Each metric is a pair of torchmetrics ``SumMetric`` s, a sum and a token count, both reduced by
summing, so the value over several ranks is Σ sums / Σ counts — the token mean of the whole
validation set, not a mean of per-rank (or per-batch) means. (``MeanMetric`` with weights would
need the per-batch mean as its input, dividing by zero for a batch with no scored tokens.)
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torchmetrics.aggregation import SumMetric

from lightning_kd.distill.teacher_domains import PER_TEACHER
from lightning_kd.utils.refusal import refuse


def fp64_sum() -> SumMetric:
    """A ``SumMetric`` that adds in fp64 and keeps NaN/inf, so a non-finite loss shows up as a
    non-finite metric rather than being dropped (torchmetrics' default, with a warning)."""
    return SumMetric(nan_strategy="disable").set_dtype(torch.float64)


class ValidationMetrics(nn.Module):
    """The validation metrics of a distillation run, logged as ``val/<name>``.

    - ``ppl`` / ``teacher_ppl``: perplexity of the student / teacher on the held-out tokens
    - ``bpb`` / ``teacher_bpb``: bits per byte of the same held-out text (comparable across
      tokenizers, where perplexities are not)
    - ``agreement``: fraction of tokens where their top-1 predictions agree (with a teacher of
      another tokenizer: of the positions aligned with it)
    - ``aligned``: with a teacher of another tokenizer, the share of positions aligned with it
    - ``kl``: KL(teacher ‖ student) per token at T = 1
    - ``loss``: the training objective's logit terms (over every teacher at its weight; none
      with teachers by domain, whose weights differ by row)
    - ``features``: the weighted feature-matching terms per token
    - ``embedding_cosine``: cosine of mean-pooled sentence embeddings (encoders), per example
    - ``kl/<name>``, ``agreement/<name>``: with several ``teachers``, each one's own (and
      ``aligned/<name>`` for one of another tokenizer); ``teacher_bpb/<name>`` for each
      teacher but the teacher group's (whose is ``teacher_bpb``)

    A metric nobody updated in an epoch is left out of :meth:`compute`.
    """

    NAMES = (
        "ppl",
        "teacher_ppl",
        "bpb",
        "teacher_bpb",
        "agreement",
        "aligned",
        "kl",
        "loss",
        "features",
        "embedding_cosine",
    )

    def __init__(self, teachers: tuple[str, ...] = ()) -> None:
        super().__init__()
        keys = (*PER_TEACHER, "teacher_bpb")  # the other teachers' bits per byte (teachers.py)
        per_teacher = [f"{key}/{name}" for name in teachers for key in keys]
        self.names = (*self.NAMES, *per_teacher)
        # By position: a module's name may not hold a dot, a teacher's may (kl/qwen2.5).
        self.slot = {name: index for index, name in enumerate(self.names)}
        self.sum_list = nn.ModuleList([fp64_sum() for _ in self.names])
        self.count_list = nn.ModuleList([fp64_sum() for _ in self.names])

    def _apply(self, fn, recurse: bool = True):
        # A cast of the module (Lightning's bf16-true / 16-true plugins cast the whole
        # LightningModule) reaches the metrics' states: sums and counts in bf16 stop growing
        # (a count stuck at 65,536 tokens, a perplexity 5x too high). They stay fp64.
        super()._apply(fn, recurse)
        for metric in [*self.sum_list, *self.count_list]:
            metric.set_dtype(torch.float64)
        return self

    def update(self, name: str, total: Tensor, count: Tensor | int) -> None:
        """Add ``total``, a sum over ``count`` tokens (or examples), to metric ``name``."""
        self.sum_list[self.slot[name]].update(total.detach())
        self.count_list[self.slot[name]].update(count)

    def compute(self) -> dict[str, Tensor]:
        """Each updated metric's token mean over all ranks (``exp`` of it for perplexities); a
        metric of no token is left out (a teacher of data domains no validation row is of):
        a mean over no token would read as a KL of 0, a perfect match, to a monitor too."""
        results = {}
        for name, total, count in zip(self.names, self.sum_list, self.count_list, strict=True):
            if not total.update_called:
                continue
            tokens = count.compute()
            if tokens == 0:
                continue
            mean = (total.compute() / tokens).float()
            results[f"val/{name}"] = mean.exp() if name.endswith("ppl") else mean
        return results

    def reset(self) -> None:
        """Zero every metric for the next validation."""
        # Outside inference mode: states reset under ``trainer.validate``'s inference mode would
        # be inference tensors, which refuse the in-place updates of ``fit``'s (no_grad)
        # validation.
        with torch.inference_mode(False):
            for metric in [*self.sum_list, *self.count_list]:
                metric.reset()


def monitored(callbacks: list) -> list[tuple[str, str]]:
    """``(what, metric)`` for each callback that monitors a validation metric (early stopping,
    a best-model checkpoint): ``what`` is the config key that set it where the callback names
    one (``monitor_key``), else the callback's class."""
    return [
        (getattr(callback, "monitor_key", type(callback).__name__), monitor)
        for callback in callbacks
        if isinstance(monitor := getattr(callback, "monitor", None), str)
        and monitor.startswith("val/")
    ]


UNTAUGHT = (
    "; a teacher's figures are logged over the validation rows of the data domains it teaches, "
    "where there are some"
)
"""Why a ``val/<metric>/<teacher>`` may be missing though that teacher is in the run."""


def checked_monitors(callbacks: list, metrics: dict[str, float]) -> dict[str, float]:
    """``metrics`` (a validation's), once every callback that monitors a validation metric
    monitors one it holds: a name it lacks stopped the run with a traceback at the first
    validation of training, and the resume it advised stopped there again."""
    wrong = [
        f"{name} monitors {monitor!r}, which validation does not log; "
        f"choose one of {sorted(metrics)} "
        + (f"({name}=...)" if "." in name else "(callbacks.<name>.monitor=...)")
        + (UNTAUGHT if monitor.count("/") == 2 else "")
        for name, monitor in monitored(callbacks)
        if monitor not in metrics
    ]
    refuse(wrong)
    return metrics


def check_monitors_first(trainer) -> None:
    """Have ``trainer`` check its monitors on one validation batch before training (Lightning's
    sanity check, whose logging is discarded and which restores the RNG), for a run with no
    validation before training (``validate_before=false``, a resume): the module checks the
    names it computes there (``on_validation_epoch_end``)."""
    if monitored(trainer.callbacks):
        trainer.num_sanity_val_steps = max(trainer.num_sanity_val_steps, 1)


def log_at_steps_done(trainer, values: dict[str, float]) -> None:
    """Give the ``values`` of a validation inside ``fit`` to ``trainer``'s loggers at the
    optimizer steps done, where Lightning logs a validation outside ``fit`` (``trainer.validate``)
    and lm-eval's scores are logged. Lightning logs one inside ``fit`` at the index of the last
    step, one less: metrics.csv held two numberings of the same steps."""
    for logger in trainer.loggers:  # each logger writes on rank 0 alone, as for Lightning's own
        logger.log_metrics(values | {"epoch": trainer.current_epoch}, step=trainer.global_step)
        logger.save()
