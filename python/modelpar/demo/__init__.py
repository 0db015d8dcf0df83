"""``python -m modelpar demo``: a small transformer from Hugging Face
transformers trained on one device, placed and pipelined on 4 CPU worker
devices and planned by ``strategy="auto"``, each checked against eager
PyTorch, with plan summaries, step times side by side, Chrome traces and a
picture of the pipeline (:mod:`modelpar.demo.run`); ``--ir`` runs the IR
walk-through instead (:mod:`modelpar.demo.ir_walkthrough`).

| module | what it holds |
|---|---|
| `run.py` | `run_demo`: the runs, the checks, the table |
| `model.py` | the model, its batches, eager's run, the tolerance against eager |
| `timeline.py` | `plot_timeline`: simulated vs measured step as a PNG (matplotlib) |
| `ir_walkthrough.py` | `run_ir_demo`: a hand-written Program verified and run |
"""

from .ir_walkthrough import run_ir_demo
from .run import run_demo

__all__ = ["run_demo", "run_ir_demo"]
