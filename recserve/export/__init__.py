"""Export: quantize a trained model's tables, place them on serving devices, write a model package."""

from recserve.export.accuracy import AccuracySample, accuracy_report, synthetic_sample
from recserve.export.exporter import DEFAULT_MAX_AUC_DROP, export_package
from recserve.export.planner import TableLoad, plan_placement
from recserve.export.quantize import dequantize_table, quantize_table

__all__ = [
    "DEFAULT_MAX_AUC_DROP",
    "AccuracySample",
    "TableLoad",
    "accuracy_report",
    "dequantize_table",
    "export_package",
    "plan_placement",
    "quantize_table",
    "synthetic_sample",
]
