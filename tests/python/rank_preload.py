"""What the rank forkserver imports before forking ranks (Note [Ranks forked
from a warm process] in rank_processes.py): the test models, the zoo's
transformers classes, peft, and the modules Dynamo and AOTAutograd load at a
rank's first compile. Importing only: no process group, thread pool, model
or compile exists in the server."""

from __future__ import annotations

import contextlib

import torch._functorch.aot_autograd  # noqa: F401
import torch._dynamo  # noqa: F401
import torch.distributed.distributed_c10d  # noqa: F401
import torch.nn.functional  # noqa: F401

import models  # noqa: F401
import tolerances  # noqa: F401
import zoo  # noqa: F401

with contextlib.suppress(ImportError):
    import transformers
    # The classes zoo.py builds (transformers imports them lazily).
    for _name in ("LlamaForCausalLM", "GPT2LMHeadModel", "BertForSequenceClassification",
                  "T5ForConditionalGeneration", "MistralForCausalLM", "MixtralForCausalLM",
                  "Qwen2ForCausalLM", "ResNetForImageClassification"):
        getattr(transformers, _name, None)
with contextlib.suppress(ImportError):
    import peft  # noqa: F401
