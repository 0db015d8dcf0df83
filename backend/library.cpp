// The anchor of libmodelpar.so, the library LibTorch programs and the Python
// extension link: it holds all of modelpar_backend (linked whole, so that the
// static registrations of device.cpp and register.cpp run when it loads).
// modelpar.h refers to detail::linked() so that a program that links the
// library but calls none of it still loads it (linkers drop unused --as-needed
// libraries, and with them the modelpar device).
#include "modelpar/modelpar.h"

namespace modelpar::detail {
bool linked() { return true; }
}  // namespace modelpar::detail
