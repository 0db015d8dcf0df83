// The boxed kernel behind every operator on the modelpar device: it records
// the call into the capture session (functional ops and views as they are,
// mutations rewritten functionally), or, for what cannot be captured, runs
// the op eagerly on the materialised CPU contents (a graph break).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace modelpar::backend {

/// The PrivateUse1 fallback and the kernel registered for every composite
/// operator (register.cpp). Throws c10::Error when tensors of the call are
/// on different devices (CPU 0-dim tensors excepted, as in eager CUDA), and
/// modelpar::UnsupportedOpError for an op that cannot be captured in strict
/// mode or changes tensor metadata in place.
void captureKernel(const c10::OperatorHandle& op, torch::jit::Stack* stack);

/// Records a mutating call functionally when possible; the copy kernels use
/// it for CPU -> modelpar copies into tensors that are part of a trace.
/// `allow_cpu_data`: non-scalar CPU tensors become graph inputs (a copy of
/// their data) instead of a device-mismatch error.
void captureCall(const c10::OperatorHandle& op, torch::jit::Stack* stack, bool allow_cpu_data);

/// Runs the op on the CPU contents of its modelpar arguments after a sync
/// and wraps the results as modelpar tensors.
void runEagerly(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace modelpar::backend
