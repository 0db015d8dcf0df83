// fmt's out-of-line half, compiled once for the whole build.
//
// Note [fmt compiled once]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// With FMT_HEADER_ONLY every translation unit that includes <fmt/core.h>
// also parses and optimises all of <fmt/format.h> and <fmt/format-inl.h>:
// about 3.5 s of the 5.5 s a typical passes/ file took to compile (GCC 12,
// -O3), across the ~90 files that include ir/check.h. Linking Debian's
// libfmt.so instead would make the Python extension need that library at
// run time, which a machine with only the wheel lacks. So the headers are
// used in their "compiled library" mode and this one file supplies what that
// mode expects from the library: the FMT_FUNC functions of format-inl.h
// (defined out of line when FMT_HEADER_ONLY is unset) and the template
// instantiations that <fmt/format.h> declares `extern template`; the
// PyTorch-free targets (ir/, passes/, their tests) get them from
// modelpar_ir.a. Code that includes PyTorch headers finds PyTorch's own fmt
// first (torch/include/fmt, another major version, whose library PyTorch
// does not export), so modelpar_runtime and everything built on it keep
// FMT_HEADER_ONLY; there it costs nothing measurable (runtime/op_call.cpp
// compiles in 9.1 s either way).
#include <fmt/format-inl.h>

FMT_BEGIN_NAMESPACE
namespace detail {
template FMT_API auto thousands_sep_impl<char>(locale_ref) -> thousands_sep_result<char>;
template FMT_API auto thousands_sep_impl<wchar_t>(locale_ref) -> thousands_sep_result<wchar_t>;
template FMT_API auto decimal_point_impl(locale_ref) -> char;
template FMT_API auto decimal_point_impl(locale_ref) -> wchar_t;
}  // namespace detail
FMT_END_NAMESPACE
