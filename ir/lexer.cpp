// PLACEHOLDER: being written.
#include "ir/ir.h"
