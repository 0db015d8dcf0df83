"""How far a modelpar result may differ from eager PyTorch, and why: the one
place where the Python tests get their tolerances.

Placing a model on several devices, micro-batching it or running it through a
different kernel path changes the order in which fp32 sums are added up: a
matmul split at another boundary, a weight gradient accumulated per
micro-batch, a reduction run on a worker thread with another intra-op thread
count, a CPU whose BLAS blocks differently. Each order is exact to within
rounding, but the orders round differently. The tolerance must absorb that
and nothing else (a real bug, such as a wrong device, a lost micro-batch or a
stale parameter, moves results by 1e-2 or more).

The bound. With u = 2^-24 (fp32 unit roundoff), a sum of n terms x_i computed
in any order has an error of at most about lambda * sqrt(n) * u * sum|x_i|
with high probability (Higham and Mary, "A new approach to probabilistic
rounding error analysis", 2019; the worst case is n * u * sum|x_i|). Two
orders differ by at most twice that. For the layers of our test models, whose
weights are initialised at about 1/sqrt(fan_in) and whose activations are
O(1), sum|x_i| is about sqrt(n), so two orders differ by about
2 * lambda * n * u in absolute terms, and by 2 * lambda * sqrt(n) * u
relative to a result that does not cancel. The absolute term is the one that
matters near zero: a logit of 1e-3 made of terms of size 1 keeps the absolute
error of those terms, which is what made a test at atol=1e-6 fail on one CPU
and pass on another (1.19e-6 on one logit of 4096).

Errors grow with depth (each layer feeds its rounding error forward with a
gain of about 1 in normalised networks) and with optimizer steps (each step
adds lr times the gradient's error to the parameters and the next step starts
from them): both multiply the bound.

lambda = 4 makes the probabilistic bound hold for all but about 1e-3 of the
sums (P >= 1 - 2 exp(-lambda^2 / 2)), and the depth factor counts every layer
as if its error added fully, which it rarely does, so the bound holds with
margin for every element of the tensors we compare. The absolute tolerance is
scaled by the largest element of the expected tensor, so a gradient of size
1e-4 gets a tolerance of its own size, not that of a logit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

__all__ = ["U", "LAMBDA", "Reordered", "Compiled", "assert_exact", "U_BF16", "assert_close_bf16"]

U = 2.0 ** -24
"""fp32 unit roundoff."""

LAMBDA = 4.0
"""Confidence factor of the probabilistic rounding-error bound."""


@dataclass(frozen=True)
class Reordered:
    """The tolerance of fp32 results whose sums were added up in another order.

    Attributes:
        reduction: the longest sum in the computation (a hidden width, a
            conv's C*k*k, or the batch*positions a weight gradient or batch
            norm sums over).
        depth: how many such reductions the value passed through in sequence
            (layers, forward and backward).
        steps: optimizer steps whose errors accumulate in the compared values.
    """
    reduction: int
    depth: int = 1
    steps: int = 1

    def __post_init__(self) -> None:
        if self.reduction < 1 or self.depth < 1 or self.steps < 1:
            raise ValueError(f"Reordered: reduction, depth and steps must be >= 1, got {self}")

    def after(self, steps: int) -> "Reordered":
        """The same computation after `steps` optimizer steps."""
        return replace(self, steps=steps)

    @property
    def rtol(self) -> float:
        """Relative error of a result that does not cancel: 2 lambda sqrt(n) u per reduction."""
        return 2 * LAMBDA * math.sqrt(self.reduction) * U * self.depth * self.steps

    @property
    def atol_per_unit(self) -> float:
        """Absolute error in units of the tensor's largest element: 2 lambda n u per reduction
        (sum|x_i| is about sqrt(n) times a typical result, which is at most the largest)."""
        return 2 * LAMBDA * self.reduction * U * self.depth * self.steps

    def tolerance(self, expected: torch.Tensor, scale: float | None = None) -> dict[str, float]:
        """``rtol`` and ``atol`` for ``torch.testing.assert_close`` against `expected`.

        `scale` is the size of the terms the compared values were summed from;
        by default the expected tensor's largest element. Give it when the
        expected value is a cancellation: a gradient that is zero in exact
        arithmetic (an attention key's bias: softmax ignores a shift of all
        scores) holds only rounding noise of its terms, which have the size of
        the model's other gradients, not of the noise."""
        if scale is None:
            scale = float(expected.detach().abs().max()) if expected.numel() else 0.0
        if not math.isfinite(scale) or scale == 0.0:
            scale = 1.0
        return {"rtol": self.rtol, "atol": self.atol_per_unit * scale}

    def assert_close(self, actual: torch.Tensor, expected: torch.Tensor, msg=None,
                     scale: float | None = None) -> None:
        """``torch.testing.assert_close`` within this tolerance (`msg` as there;
        `scale` as in :meth:`tolerance`)."""
        tol = self.tolerance(expected, scale)
        if msg is None:
            torch.testing.assert_close(actual, expected, **tol)
        else:
            torch.testing.assert_close(actual, expected, **tol, msg=msg)


@dataclass(frozen=True)
class Compiled(Reordered):
    """The tolerance of fp32 results computed by Inductor's kernels
    (``kernels="inductor"``: Note [Kernel regions]) against ATen's.

    Inductor changes three things, each bounded:
    - it reorders reductions (split and vectorised partial sums, Welford's
      variance, an online softmax's running maximum): a sum in another
      order, which ``Reordered`` already bounds;
    - it fuses pointwise chains into one loop: each op's result is still
      rounded to fp32, but a multiply feeding an add may contract to one
      fused multiply-add (one rounding instead of two), at most one
      rounding (u) of difference per op;
    - its vectorised transcendental functions (exp, tanh, erf: Sleef's 1-ulp
      versions) are not libm's (0.5 ulp): the two differ by at most about
      1.5 ulp of the result, 2u relative.
    So two implementations differ, on top of the reordering, by at most 2u
    per pointwise op a value passes through, relative to the value (and in
    units of the tensor's largest element for the absolute part).

    Attributes:
        pointwise: pointwise ops per layer a value passes through (an
            activation, a norm's scale and shift, a residual add, a softmax's
            exp and divide, an optimizer's update: 16 covers a transformer
            block); it multiplies by depth and steps like the reductions.
    """
    pointwise: int = 16

    @property
    def rtol(self) -> float:
        return super().rtol + 2 * self.pointwise * U * self.depth * self.steps

    @property
    def atol_per_unit(self) -> float:
        return super().atol_per_unit + 2 * self.pointwise * U * self.depth * self.steps


def assert_exact(actual: torch.Tensor, expected: torch.Tensor, msg=None) -> None:
    """Bit-for-bit equality: for results computed by the same kernels on the same
    shapes in the same order (one device, one thread issuing them)."""
    kw = {} if msg is None else {"msg": msg}
    torch.testing.assert_close(actual, expected, rtol=0.0, atol=0.0, **kw)


U_BF16 = 2.0 ** -8
"""bfloat16 unit roundoff (8 significant bits)."""


def assert_close_bf16(actual: torch.Tensor, expected: torch.Tensor, msg=None,
                      scale: float | None = None, ulps: float = 4.0) -> None:
    """Agreement of results computed under ``torch.autocast(dtype=torch.bfloat16)``.

    Autocast rounds each matmul's (and each autocast op's) result to bfloat16.
    Micro-batching rounds the partial weight gradients of every micro-batch
    before they are summed, where eager rounds the full batch's once; and a
    value whose fp32 inputs differ by reorder noise (placement, intra-op
    threads) may round to the neighbouring bfloat16. Either moves an element
    by about one bfloat16 ulp of the terms it is made of (U_BF16 relative);
    ``ulps`` of them, at the scale of the expected tensor's largest element
    (or `scale`), absorb that. A bug moves results by far more than 4 ulps
    (1.6 %) of the model's scale.
    """
    if scale is None:
        scale = float(expected.detach().abs().max()) if expected.numel() else 0.0
    if not math.isfinite(scale) or scale == 0.0:
        scale = 1.0
    kw = {} if msg is None else {"msg": msg}
    torch.testing.assert_close(actual.float(), expected.float(), rtol=ulps * U_BF16,
                               atol=ulps * U_BF16 * scale, **kw)
