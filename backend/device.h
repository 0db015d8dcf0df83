// The modelpar device (PrivateUse1): what the rest of the backend asks of it.
#pragma once

namespace modelpar::backend {

/// Names PrivateUse1 "modelpar" (once; later calls do nothing). Not done when
/// the library loads: Note [Naming the device is not free] in device.cpp.
void nameDevice();

}  // namespace modelpar::backend
