// libFuzzer target for the IR text parser (scripts/fuzz_parser.sh builds and
// runs it). For any input:
//   - parseGraph and parseProgram either succeed or throw ParseError (an
//     InvalidIrError from a check the parser shares with the IR is accepted
//     too); any other exception, a crash or a sanitizer report is a finding;
//   - what parses prints, and the printed text parses back to an equal object
//     that prints to the same text (`parse(print(x)) == x`);
//   - verify() on what parses returns or throws InvalidIrError, never crashes.
// A finding is fixed with a regression test in tests/ir/ (see
// tests/ir/parser_fuzz_regression_test.cpp).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "ir/error.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"

namespace {

using namespace modelpar;

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "ir_parser_fuzz: %s\n%s\n", what, detail.c_str());
  std::abort();
}

template <class T, class Parse>
void checkRoundTrip(std::string_view text, Parse parse) {
  std::optional<T> x;  // Program has no default constructor
  try {
    x.emplace(parse(text));
  } catch (const InvalidIrError&) {
    return;  // ParseError (or a shared IR check): the expected way to refuse text
  }
  std::string printed = ir::print(*x);
  std::optional<T> y;
  try {
    y.emplace(parse(printed));
  } catch (const Error& e) {
    fail("printed text does not parse back", std::string(e.what()) + "\n--- printed:\n" + printed);
  }
  if (!(*y == *x)) fail("parse(print(x)) != x", printed);
  std::string again = ir::print(*y);
  if (again != printed) fail("print(parse(print(x))) != print(x)", printed + "\n--- again:\n" + again);
  try {
    ir::verify(*x);
  } catch (const InvalidIrError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  checkRoundTrip<ir::Graph>(text, [](std::string_view t) { return ir::parseGraph(t); });
  checkRoundTrip<ir::Program>(text, [](std::string_view t) { return ir::parseProgram(t); });
  return 0;
}
