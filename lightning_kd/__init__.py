"""lightning-kd: distil a Hugging Face teacher into a smaller student with PyTorch Lightning."""

from lightning_kd.data import TextDataModule
from lightning_kd.models import StudentSpec, TeacherSpec
from lightning_kd.module import DistillationModule
from lightning_kd.objective import DistillConfig

__all__ = ["DistillConfig", "DistillationModule", "StudentSpec", "TeacherSpec", "TextDataModule"]
__version__ = "0.1.0"
