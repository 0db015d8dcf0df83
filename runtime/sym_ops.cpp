// modelpar::sym_* operators: Python's arithmetic on sizes, callable through
// the c10 dispatcher (sym_ops.h).
#include "runtime/sym_ops.h"

#include <cmath>
#include <cstdint>
#include <limits>
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

// Note [Checked size arithmetic]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Python ints do not overflow; ours are int64_t, where overflow (and
// INT64_MIN / -1, which traps on x86) is undefined behaviour. Every int
// operation is checked and a result outside int64 is an error, as are the
// cases where Python raises (division by zero, int(nan), int(inf)). Errors
// are c10::Errors (TORCH_CHECK), which the interpreters rethrow as an
// ExecutionError naming the node.

int64_t checkedAdd(int64_t a, int64_t b, const char* op) {
  int64_t r = 0;
  TORCH_CHECK(!__builtin_add_overflow(a, b, &r), "modelpar::", op, ": integer overflow: ", a,
              " + ", b, " does not fit in int64");
  return r;
}
int64_t checkedSub(int64_t a, int64_t b, const char* op) {
  int64_t r = 0;
  TORCH_CHECK(!__builtin_sub_overflow(a, b, &r), "modelpar::", op, ": integer overflow: ", a,
              " - ", b, " does not fit in int64");
  return r;
}
int64_t checkedMul(int64_t a, int64_t b, const char* op) {
  int64_t r = 0;
  TORCH_CHECK(!__builtin_mul_overflow(a, b, &r), "modelpar::", op, ": integer overflow: ", a,
              " * ", b, " does not fit in int64");
  return r;
}

int64_t floorDiv(int64_t a, int64_t b) {
  TORCH_CHECK(b != 0, "modelpar::sym_floordiv: integer division by zero (", a, " // 0)");
  TORCH_CHECK(!(a == std::numeric_limits<int64_t>::min() && b == -1),
              "modelpar::sym_floordiv: integer overflow: ", a, " // -1 does not fit in int64");
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t floorMod(int64_t a, int64_t b) {
  TORCH_CHECK(b != 0, "modelpar::sym_mod: integer modulo by zero (", a, " % 0)");
  if (b == -1) return 0;  // INT64_MIN % -1 traps on x86; the remainder is 0 for every a
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

// A float converted to int the way Python's int() / math.ceil / math.floor
// do, after `round`: nan and inf are errors, as are values outside int64.
int64_t toInt64(double rounded, const char* op, double original) {
  TORCH_CHECK(!std::isnan(rounded), "modelpar::", op, ": cannot convert float nan to integer");
  TORCH_CHECK(!std::isinf(rounded), "modelpar::", op, ": cannot convert float ",
              rounded > 0 ? "inf" : "-inf", " to integer");
  // 2^63 is exactly representable; every double below it and >= -2^63 fits.
  constexpr double kTwo63 = 9223372036854775808.0;
  TORCH_CHECK(rounded >= -kTwo63 && rounded < kTwo63, "modelpar::", op, ": float ", original,
              " does not fit in int64");
  return static_cast<int64_t>(rounded);
}

Scalar symAdd(const Scalar& a, const Scalar& b) {
  if (isInt(a) && isInt(b)) return checkedAdd(asInt(a), asInt(b), "sym_add");
  return asDouble(a) + asDouble(b);
}
Scalar symSub(const Scalar& a, const Scalar& b) {
  if (isInt(a) && isInt(b)) return checkedSub(asInt(a), asInt(b), "sym_sub");
  return asDouble(a) - asDouble(b);
}
Scalar symMul(const Scalar& a, const Scalar& b) {
  if (isInt(a) && isInt(b)) return checkedMul(asInt(a), asInt(b), "sym_mul");
  return asDouble(a) * asDouble(b);
}
Scalar symFloorDiv(const Scalar& a, const Scalar& b) {
  if (isInt(a) && isInt(b)) return floorDiv(asInt(a), asInt(b));
  TORCH_CHECK(asDouble(b) != 0.0, "modelpar::sym_floordiv: float division by zero (",
              asDouble(a), " // 0)");
  return std::floor(asDouble(a) / asDouble(b));
}
Scalar symMod(const Scalar& a, const Scalar& b) {
  if (isInt(a) && isInt(b)) return floorMod(asInt(a), asInt(b));
  const double x = asDouble(a), y = asDouble(b);
  TORCH_CHECK(y != 0.0, "modelpar::sym_mod: float modulo by zero (", x, " % 0)");
  double r = std::fmod(x, y);
  if (r != 0 && ((r < 0) != (y < 0))) r += y;
  return r;
}
Scalar symTrueDiv(const Scalar& a, const Scalar& b) {
  TORCH_CHECK(asDouble(b) != 0.0, "modelpar::sym_truediv: division by zero (", asDouble(a), " / 0)");
  return asDouble(a) / asDouble(b);
}
Scalar symPow(const Scalar& a, const Scalar& b) {
  if (isInt(a) && isInt(b) && asInt(b) >= 0) {
    const int64_t a0 = asInt(a), b0 = asInt(b);
    int64_t base = a0, e = b0, r = 1;
    while (e > 0) {
      if (e & 1) {
        TORCH_CHECK(!__builtin_mul_overflow(r, base, &r), "modelpar::sym_pow: integer overflow: ",
                    a0, " ** ", b0, " does not fit in int64");
      }
      e >>= 1;
      // Square only when another bit needs it: base*base may overflow after the last one.
      if (e > 0) {
        TORCH_CHECK(!__builtin_mul_overflow(base, base, &base),
                    "modelpar::sym_pow: integer overflow: ", a0, " ** ", b0,
                    " does not fit in int64");
      }
    }
    return r;
  }
  TORCH_CHECK(!(asDouble(a) == 0.0 && asDouble(b) < 0), "modelpar::sym_pow: 0 cannot be raised to "
              "a negative power (0 ** ", asDouble(b), ")");
  return std::pow(asDouble(a), asDouble(b));
}
Scalar symNeg(const Scalar& a) {
  if (isInt(a)) return checkedSub(0, asInt(a), "sym_neg");
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
  return isInt(a) ? asInt(a) : toInt64(std::trunc(asDouble(a)), "sym_int", asDouble(a));
}
int64_t symCeil(const Scalar& a) {
  return isInt(a) ? asInt(a) : toInt64(std::ceil(asDouble(a)), "sym_ceil", asDouble(a));
}
int64_t symFloor(const Scalar& a) {
  return isInt(a) ? asInt(a) : toInt64(std::floor(asDouble(a)), "sym_floor", asDouble(a));
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
