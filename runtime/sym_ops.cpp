// modelpar::sym_* operators: Python's arithmetic on sizes, callable through
// the c10 dispatcher (sym_ops.h).
#include "runtime/sym_ops.h"

#include <cmath>
#include <cstdint>
#include <mutex>

#include <c10/core/Scalar.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

namespace modelpar::runtime {
namespace {

using c10::Scalar;

// Booleans count as ints, as in Python (True + 1 == 2).
bool isInt(const Scalar& s) { return s.isIntegral(/*includeBool=*/true); }
int64_t asInt(const Scalar& s) { return s.isBoolean() ? int64_t{s.toBool()} : s.toLong(); }
double asDouble(const Scalar& s) { return s.isBoolean() ? double{s.toBool() ? 1.0 : 0.0} : s.toDouble(); }

int64_t floorDiv(int64_t a, int64_t b) {
  TORCH_CHECK(b != 0, "modelpar::sym_floordiv: integer division by zero");
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t floorMod(int64_t a, int64_t b) {
  TORCH_CHECK(b != 0, "modelpar::sym_mod: integer modulo by zero");
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

Scalar symAdd(const Scalar& a, const Scalar& b) {
  if (isInt(a) && isInt(b)) return asInt(a) + asInt(b);
  return asDouble(a) + asDouble(b);
}
Scalar symSub(const Scalar& a, const Scalar& b) {
  if (isInt(a) && isInt(b)) return asInt(a) - asInt(b);
  return asDouble(a) - asDouble(b);
}
Scalar symMul(const Scalar& a, const Scalar& b) {
  if (isInt(a) && isInt(b)) return asInt(a) * asInt(b);
  return asDouble(a) * asDouble(b);
}
Scalar symFloorDiv(const Scalar& a, const Scalar& b) {
  if (isInt(a) && isInt(b)) return floorDiv(asInt(a), asInt(b));
  return std::floor(asDouble(a) / asDouble(b));
}
Scalar symMod(const Scalar& a, const Scalar& b) {
  if (isInt(a) && isInt(b)) return floorMod(asInt(a), asInt(b));
  const double x = asDouble(a), y = asDouble(b);
  double r = std::fmod(x, y);
  if (r != 0 && ((r < 0) != (y < 0))) r += y;
  return r;
}
Scalar symTrueDiv(const Scalar& a, const Scalar& b) { return asDouble(a) / asDouble(b); }
Scalar symPow(const Scalar& a, const Scalar& b) {
  if (isInt(a) && isInt(b) && asInt(b) >= 0) {
    int64_t base = asInt(a), e = asInt(b), r = 1;
    while (e > 0) {
      if (e & 1) r *= base;
      base *= base;
      e >>= 1;
    }
    return r;
  }
  return std::pow(asDouble(a), asDouble(b));
}
Scalar symNeg(const Scalar& a) {
  if (isInt(a)) return -asInt(a);
  return -asDouble(a);
}
Scalar symMax(const Scalar& a, const Scalar& b) {
  if (isInt(a) && isInt(b)) return std::max(asInt(a), asInt(b));
  return std::max(asDouble(a), asDouble(b));
}
Scalar symMin(const Scalar& a, const Scalar& b) {
  if (isInt(a) && isInt(b)) return std::min(asInt(a), asInt(b));
  return std::min(asDouble(a), asDouble(b));
}

// Comparisons: exact on ints, on doubles otherwise.
template <typename Cmp>
bool compare(const Scalar& a, const Scalar& b, Cmp cmp) {
  if (isInt(a) && isInt(b)) return cmp(asInt(a), asInt(b));
  return cmp(asDouble(a), asDouble(b));
}
bool symEq(const Scalar& a, const Scalar& b) { return compare(a, b, std::equal_to<>()); }
bool symNe(const Scalar& a, const Scalar& b) { return compare(a, b, std::not_equal_to<>()); }
bool symLt(const Scalar& a, const Scalar& b) { return compare(a, b, std::less<>()); }
bool symLe(const Scalar& a, const Scalar& b) { return compare(a, b, std::less_equal<>()); }
bool symGt(const Scalar& a, const Scalar& b) { return compare(a, b, std::greater<>()); }
bool symGe(const Scalar& a, const Scalar& b) { return compare(a, b, std::greater_equal<>()); }
bool symNot(const Scalar& a) { return isInt(a) ? asInt(a) == 0 : asDouble(a) == 0.0; }

double symFloat(const Scalar& a) { return asDouble(a); }
int64_t symInt(const Scalar& a) {  // int(x): toward zero
  return isInt(a) ? asInt(a) : static_cast<int64_t>(std::trunc(asDouble(a)));
}
int64_t symCeil(const Scalar& a) {
  return isInt(a) ? asInt(a) : static_cast<int64_t>(std::ceil(asDouble(a)));
}
int64_t symFloor(const Scalar& a) {
  return isInt(a) ? asInt(a) : static_cast<int64_t>(std::floor(asDouble(a)));
}

}  // namespace

const std::vector<std::string>& symOpNames() {
  static const std::vector<std::string> names = {
      "sym_add", "sym_sub", "sym_mul", "sym_floordiv", "sym_mod", "sym_truediv", "sym_pow",
      "sym_neg", "sym_max", "sym_min", "sym_eq",       "sym_ne",  "sym_lt",      "sym_le",
      "sym_gt",  "sym_ge",  "sym_not", "sym_float",    "sym_int", "sym_ceil",    "sym_floor"};
  return names;
}

void registerSymOps() {
  // A fragment, not TORCH_LIBRARY: other parts of modelpar may define ops in
  // the same namespace. No tensor arguments, so the dispatcher calls the
  // catch-all (CompositeImplicitAutograd) kernel for every key set.
  static std::once_flag once;
  std::call_once(once, [] {
    static torch::Library lib(torch::Library::FRAGMENT, "modelpar", std::nullopt, __FILE__,
                              __LINE__);
    lib.def("sym_add(Scalar a, Scalar b) -> Scalar", &symAdd);
    lib.def("sym_sub(Scalar a, Scalar b) -> Scalar", &symSub);
    lib.def("sym_mul(Scalar a, Scalar b) -> Scalar", &symMul);
    lib.def("sym_floordiv(Scalar a, Scalar b) -> Scalar", &symFloorDiv);
    lib.def("sym_mod(Scalar a, Scalar b) -> Scalar", &symMod);
    lib.def("sym_truediv(Scalar a, Scalar b) -> Scalar", &symTrueDiv);
    lib.def("sym_pow(Scalar a, Scalar b) -> Scalar", &symPow);
    lib.def("sym_neg(Scalar a) -> Scalar", &symNeg);
    lib.def("sym_max(Scalar a, Scalar b) -> Scalar", &symMax);
    lib.def("sym_min(Scalar a, Scalar b) -> Scalar", &symMin);
    lib.def("sym_eq(Scalar a, Scalar b) -> bool", &symEq);
    lib.def("sym_ne(Scalar a, Scalar b) -> bool", &symNe);
    lib.def("sym_lt(Scalar a, Scalar b) -> bool", &symLt);
    lib.def("sym_le(Scalar a, Scalar b) -> bool", &symLe);
    lib.def("sym_gt(Scalar a, Scalar b) -> bool", &symGt);
    lib.def("sym_ge(Scalar a, Scalar b) -> bool", &symGe);
    lib.def("sym_not(Scalar a) -> bool", &symNot);
    lib.def("sym_float(Scalar a) -> float", &symFloat);
    lib.def("sym_int(Scalar a) -> int", &symInt);
    lib.def("sym_ceil(Scalar a) -> int", &symCeil);
    lib.def("sym_floor(Scalar a) -> int", &symFloor);
  });
}

}  // namespace modelpar::runtime
