// Parser error paths: each throws ParseError whose message starts with
// `modelpar ir parse: LINE:COL:` and whose textLine()/textColumn() point at
// the offending token.
#include <gtest/gtest.h>

#include <functional>

#include "ir/error.h"
#include "ir/parser.h"

namespace modelpar::ir {
namespace {

void expectError(const std::function<void()>& parse, int line, int column,
                 std::initializer_list<std::string_view> words) {
  try {
    parse();
    ADD_FAILURE() << "expected a ParseError";
  } catch (const ParseError& e) {
    std::string msg = e.what();
    EXPECT_EQ(e.textLine(), line) << msg;
    EXPECT_EQ(e.textColumn(), column) << msg;
    std::string prefix = "modelpar ir parse: " + std::to_string(line) + ":" +
                         std::to_string(column) + ": ";
    EXPECT_EQ(msg.substr(0, prefix.size()), prefix) << msg;
    for (std::string_view w : words) {
      EXPECT_NE(msg.find(w), std::string::npos) << "missing '" << w << "' in: " << msg;
    }
  }
}

void expectGraphError(std::string_view text, int line, int column,
                      std::initializer_list<std::string_view> words) {
  expectError([&] { parseGraph(text); }, line, column, words);
}

void expectProgramError(std::string_view text, int line, int column,
                        std::initializer_list<std::string_view> words) {
  expectError([&] { parseProgram(text); }, line, column, words);
}

// A one-node graph around `body` (a node line), for node-level errors on line 2.
std::string inGraph(std::string_view body) {
  return "graph @g(%x: f32[2] input) {\n" + std::string(body) + "\n  return\n}\n";
}

constexpr std::string_view kProgramHead =
    "program devices=2\n"
    "graph @g(%x: f32[2] input {device=0}) {\n"
    "  %y: f32[2], %z: f32[2] = aten::split(%x, 1)\n"
    "  ^l = aten::print(%x)\n"
    "  return %y\n"
    "}\n";  // 6 lines

// ---- tokens ----

TEST(ParserErrors, ReportsLineAndColumnOfUnexpectedCharacter) {
  expectGraphError("graph @g() {\n  $\n", 2, 3, {"unexpected character '$'"});
}

TEST(ParserErrors, ReportsUnexpectedControlByteInHex) {
  expectGraphError("graph @g() {\x01}", 1, 13, {"unexpected byte 0x01"});
}

TEST(ParserErrors, ReportsSigilWithoutName) {
  expectGraphError("graph @g(% : f32[2] input) {\n  return\n}", 1, 10, {"expected a name after '%'"});
}

TEST(ParserErrors, ReportsUnterminatedStringAtItsStartWhenInputEnds) {
  expectGraphError(inGraph("  %y: f32[2] = t::s(%x, \"abc"), 2, 25, {"unterminated string"});
}

TEST(ParserErrors, ReportsUnterminatedStringThatRunsIntoANewline) {
  expectGraphError(inGraph("  %y: f32[2] = t::s(%x, \"abc\n\")"), 2, 25, {"unterminated string"});
}

TEST(ParserErrors, ReportsUnknownEscapeInString) {
  expectGraphError(inGraph("  %y: f32[2] = t::s(%x, \"a\\qb\")"), 2, 27,
                   {"bad escape", "\\xHH"});
}

// ---- graph structure ----

TEST(ParserErrors, ReportsExpectedTokenAndWhatWasFound) {
  expectGraphError("graph g() {\n  return\n}", 1, 7, {"expected '@'", "found 'g'"});
}

TEST(ParserErrors, ReportsEndOfInputInsideGraph) {
  expectGraphError("graph @g(%x: f32[2] input) {\n", 2, 1,
                   {"expected a node", "or 'return'", "found end of input"});
}

TEST(ParserErrors, RejectsTrailingGarbageAfterGraph) {
  expectGraphError("graph @g() {\n  return\n}\ngraph", 4, 1,
                   {"expected end of input after the graph", "found 'graph'"});
}

TEST(ParserErrors, ReportsLineAndColumnOfUnknownDtype) {
  expectGraphError("graph @g(\n    %x: f31[2] input) {\n  return\n}", 2, 9,
                   {"unknown dtype 'f31'", "known: bool u8", "f8e5m2"});
}

TEST(ParserErrors, ReportsDimensionThatIsNeitherIntegerNorSymbol) {
  expectGraphError("graph @g(%x: f32[2, \"B\"] input) {\n  return\n}", 1, 21,
                   {"expected dimension", "found '\"B\"'"});
}

TEST(ParserErrors, ReportsUnknownInputRole) {
  expectGraphError("graph @g(%x: f32[2] weight) {\n  return\n}", 1, 21,
                   {"unknown input role 'weight'", "known: input param buffer"});
}

TEST(ParserErrors, ReportsUnknownInputAttribute) {
  expectGraphError("graph @g(%x: f32[2] input {layer=\"a\"}) {\n  return\n}", 1, 28,
                   {"unknown input attribute 'layer'", "known: device"});
}

TEST(ParserErrors, ReportsInputDeviceGivenTwice) {
  expectGraphError("graph @g(%x: f32[2] input {device=0, device=1}) {\n  return\n}", 1, 38,
                   {"attribute 'device' given twice"});
}

TEST(ParserErrors, ReportsDuplicateValueNameAtItsSecondDefinition) {
  expectGraphError("graph @g(%x: f32[2] input, %x: f32[2] input) {\n  return\n}", 1, 28,
                   {"%x", "defined twice"});
}

TEST(ParserErrors, ReportsNodeOutputRedefiningAValueAtTheOperator) {
  expectGraphError(inGraph("  %x: f32[2] = aten::neg(%x)"), 2, 16, {"%x", "defined twice"});
}

TEST(ParserErrors, ReportsDuplicateLabel) {
  expectGraphError(inGraph("  ^a = t::p(%x)\n  ^a = t::p(%x)"), 3, 3, {"label ^a", "twice"});
}

TEST(ParserErrors, ReportsUseOfValueBeforeItIsDefined) {
  expectGraphError(inGraph("  %y: f32[2] = aten::add(%z, %x)\n  %z: f32[2] = aten::neg(%x)"), 2,
                   26, {"value %z is used before it is defined"});
}

TEST(ParserErrors, ReportsUndefinedValueInReturn) {
  expectGraphError("graph @g(%x: f32[2] input) {\n  return %x, %nope\n}", 2, 14,
                   {"value %nope is used before it is defined"});
}

TEST(ParserErrors, ReportsMissingOperatorNamespace) {
  expectGraphError(inGraph("  %y: f32[2] = neg(%x)"), 2, 19, {"expected '::'", "found '('"});
}

// ---- arguments ----

TEST(ParserErrors, ReportsMissingArgument) {
  expectGraphError(inGraph("  %y: f32[2] = aten::neg(%x, )"), 2, 30,
                   {"expected an argument", "found ')'"});
}

TEST(ParserErrors, ReportsUnknownArgumentWord) {
  expectGraphError(inGraph("  %y: f32[2] = aten::neg(%x, Nil)"), 2, 30,
                   {"unknown argument word 'Nil'", "None true false"});
}

TEST(ParserErrors, ReportsUnknownDtypeConstant) {
  expectGraphError(inGraph("  %y: f32[2] = aten::to(%x, dtype.float)"), 2, 35,
                   {"unknown dtype 'float'", "known: bool"});
}

TEST(ParserErrors, ReportsUnknownLayoutConstant) {
  expectGraphError(inGraph("  %y: f32[2] = t::o(%x, layout.dense)"), 2, 32,
                   {"unknown layout 'dense'", "strided"});
}

TEST(ParserErrors, ReportsUnknownMemoryFormatConstant) {
  expectGraphError(inGraph("  %y: f32[2] = t::o(%x, memory_format.nhwc)"), 2, 39,
                   {"unknown memory format 'nhwc'", "channels_last"});
}

TEST(ParserErrors, ReportsDeviceConstantWithoutString) {
  expectGraphError(inGraph("  %y: f32[2] = t::o(%x, device(cuda))"), 2, 32,
                   {"expected device string", "found 'cuda'"});
}

TEST(ParserErrors, ReportsIntegerOutOfRange) {
  expectGraphError(inGraph("  %y: f32[2] = t::o(%x, 9223372036854775808)"), 2, 25,
                   {"integer 9223372036854775808 is out of range"});
}

TEST(ParserErrors, ReportsFloatOutOfRange) {
  expectGraphError(inGraph("  %y: f32[2] = t::o(%x, 1e400)"), 2, 25,
                   {"number 1e400 is out of range"});
}

// Over-long digit strings and out-of-range numbers: every from_chars error
// path is a ParseError naming the number, never an exception of another type.
constexpr std::string_view k40Digits = "1234567890123456789012345678901234567890";

TEST(ParserErrors, ReportsFortyDigitIntegerArgument) {
  expectGraphError(inGraph("  %y: f32[2] = t::o(%x, " + std::string(k40Digits) + ")"), 2, 25,
                   {"integer 1234567890123456789012345678901234567890 is out of range"});
}

TEST(ParserErrors, ReportsFortyDigitNegativeIntegerInAList) {
  expectGraphError(inGraph("  %y: f32[2] = t::o(%x, [1, -" + std::string(k40Digits) + "])"), 2, 29,
                   {"integer -1234567890123456789012345678901234567890 is out of range"});
}

TEST(ParserErrors, ReportsIntegerOneBelowInt64Min) {
  expectGraphError(inGraph("  %y: f32[2] = t::o(%x, -9223372036854775809)"), 2, 25,
                   {"integer -9223372036854775809 is out of range"});
}

TEST(ParserErrors, ReportsHundredThousandDigitIntegerWithoutCrashing) {
  const std::string digits(100000, '7');
  try {
    parseGraph(inGraph("  %y: f32[2] = t::o(%x, " + digits + ")"));
    ADD_FAILURE() << "expected a ParseError";
  } catch (const ParseError& e) {
    EXPECT_EQ(e.textColumn(), 25);
    EXPECT_NE(std::string(e.what()).find("is out of range"), std::string::npos);
  }
}

TEST(ParserErrors, ReportsFortyDigitDimension) {
  expectGraphError("graph @g(%x: f32[2, " + std::string(k40Digits) + "] input) {\n  return\n}", 1, 21,
                   {"dimension (an integer or a symbol) 1234567890123456789012345678901234567890 "
                    "is out of range"});
}

TEST(ParserErrors, ReportsFloatArgumentOf1e999) {
  expectGraphError(inGraph("  %y: f32[2] = t::o(%x, 1e999)"), 2, 25,
                   {"number 1e999 is out of range for a double"});
}

TEST(ParserErrors, ReportsNegativeFloatArgumentOfMinus1e999) {
  expectGraphError(inGraph("  %y: f32[2] = t::o(%x, -1.5e999)"), 2, 25,
                   {"number -1.5e999 is out of range for a double"});
}

TEST(ParserErrors, ReportsCostTimeOf1e999) {
  expectGraphError(
      inGraph("  %y: f32[2] = aten::neg(%x) {cost={time_us=1e999, out=0, temp=0, persist=0}}"), 2,
      45, {"number 1e999 is out of range for a double"});
}

TEST(ParserErrors, ReportsFortyDigitCostBytes) {
  expectGraphError(inGraph("  %y: f32[2] = aten::neg(%x) {cost={time_us=1, out=" +
                           std::string(k40Digits) + ", temp=0, persist=0}}"),
                   2, 52, {"output bytes 1234567890123456789012345678901234567890 is out of range"});
}

TEST(ParserErrors, ReportsFortyDigitMicroBatch) {
  expectGraphError(inGraph("  %y: f32[2] = aten::neg(%x) {mb=" + std::string(k40Digits) + "}"), 2,
                   34, {"micro-batch 1234567890123456789012345678901234567890 is out of range"});
}

TEST(ParserErrors, ReportsListsNestedTooDeeply) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  expectGraphError(inGraph("  %y: f32[2] = t::o(%x, " + deep + ")"), 2, 57,
                   {"lists nest deeper than 32 levels"});
}

TEST(ParserAccepts, ListsNestedThirtyTwoDeep) {
  const std::string deep = std::string(32, '[') + "1" + std::string(32, ']');
  EXPECT_NO_THROW(parseGraph(inGraph("  %y: f32[2] = t::o(%x, " + deep + ")")));
}

// ---- node attributes ----

TEST(ParserErrors, ReportsUnknownAttribute) {
  expectGraphError(inGraph("  %y: f32[2] = aten::neg(%x) {foo=1}"), 2, 31,
                   {"unknown attribute 'foo'", "known: layer, phase, device, mb, cost"});
}

TEST(ParserErrors, ReportsAttributeGivenTwice) {
  expectGraphError(inGraph("  %y: f32[2] = aten::neg(%x) {device=0, mb=1, device=1}"), 2, 47,
                   {"attribute 'device' given twice"});
}

TEST(ParserErrors, ReportsUnknownPhase) {
  expectGraphError(inGraph("  %y: f32[2] = aten::neg(%x) {phase=forward}"), 2, 37,
                   {"unknown phase 'forward'", "known: fwd bwd recompute update"});
}

TEST(ParserErrors, ReportsNonStringLayer) {
  expectGraphError(inGraph("  %y: f32[2] = aten::neg(%x) {layer=fc1}"), 2, 37,
                   {"expected layer name (a string)", "found 'fc1'"});
}

TEST(ParserErrors, ReportsDeviceAttributeOutOfInt32Range) {
  expectGraphError(inGraph("  %y: f32[2] = aten::neg(%x) {device=4294967296}"), 2, 38,
                   {"device 4294967296 is out of range"});
}

TEST(ParserErrors, ReportsCostFieldsOutOfOrder) {
  expectGraphError(
      inGraph("  %y: f32[2] = aten::neg(%x) {cost={time_us=1.0, temp=0, out=0, persist=0}}"), 2,
      50, {"expected 'out'", "found 'temp'"});
}

TEST(ParserErrors, ReportsNonNumericCostTime) {
  expectGraphError(
      inGraph("  %y: f32[2] = aten::neg(%x) {cost={time_us=\"1\", out=0, temp=0, persist=0}}"), 2,
      45, {"expected time in microseconds", "found '\"1\"'"});
}

// ---- programs ----

TEST(ParserErrors, ReportsMissingProgramHeader) {
  expectProgramError("graph @g() {\n  return\n}", 1, 1, {"expected 'program'", "found 'graph'"});
}

TEST(ParserErrors, RejectsProgramWithZeroDevices) {
  expectProgramError("program devices=0\ngraph @g() {\n  return\n}", 1, 17,
                     {"device count 0 is out of range"});
}

TEST(ParserErrors, ReportsGarbageWhereDeviceBlockShouldBe) {
  expectProgramError(std::string(kProgramHead) + "run %y\n", 7, 1,
                     {"expected 'device' block or end of input", "found 'run'"});
}

TEST(ParserErrors, ReportsDeviceBlockOutOfRange) {
  expectProgramError(std::string(kProgramHead) + "device 3 {\n}\n", 7, 8,
                     {"device block 3 is out of range (program has 2 devices)"});
}

TEST(ParserErrors, ReportsFortyDigitDeviceCount) {
  expectProgramError("program devices=" + std::string(k40Digits) + "\ngraph @g() {\n  return\n}", 1,
                     17, {"device count 1234567890123456789012345678901234567890 is out of range"});
}

TEST(ParserErrors, ReportsFortyDigitDeviceBlock) {
  expectProgramError(std::string(kProgramHead) + "device " + std::string(k40Digits) + " {\n}", 7, 8,
                     {"device block 1234567890123456789012345678901234567890 is out of range"});
}

TEST(ParserErrors, ReportsFortyDigitSendPeer) {
  expectProgramError(std::string(kProgramHead) + "device 0 {\n  send %x -> " +
                         std::string(k40Digits) + "\n}",
                     8, 14, {"destination device 1234567890123456789012345678901234567890 is out of range"});
}

TEST(ParserErrors, ReportsDeviceBlockGivenTwice) {
  expectProgramError(std::string(kProgramHead) + "device 1 {\n}\ndevice 1 {\n}\n", 9, 8,
                     {"device block 1 appears twice"});
}

TEST(ParserErrors, ReportsUnknownInstruction) {
  expectProgramError(std::string(kProgramHead) + "device 0 {\n  jump %y\n}\n", 8, 3,
                     {"unknown instruction 'jump'", "known: run send recv free"});
}

TEST(ParserErrors, ReportsUnterminatedDeviceBlock) {
  expectProgramError(std::string(kProgramHead) + "device 0 {\n  run %y\n", 9, 1,
                     {"expected instruction", "found end of input"});
}

TEST(ParserErrors, ReportsRunOfUnknownLabel) {
  expectProgramError(std::string(kProgramHead) + "device 0 {\n  run ^nope\n}\n", 8, 7,
                     {"no node is labelled ^nope"});
}

TEST(ParserErrors, ReportsRunOfGraphInput) {
  expectProgramError(std::string(kProgramHead) + "device 0 {\n  run %x\n}\n", 8, 7,
                     {"%x is a graph input"});
}

TEST(ParserErrors, ReportsRunOfSecondOutputAndNamesTheFirst) {
  expectProgramError(std::string(kProgramHead) + "device 0 {\n  run %z\n}\n", 8, 7,
                     {"%z is output 1", "first output %y"});
}

TEST(ParserErrors, ReportsUndefinedValueInInstruction) {
  expectProgramError(std::string(kProgramHead) + "device 0 {\n  free %w\n}\n", 8, 8,
                     {"value %w is used before it is defined"});
}

TEST(ParserErrors, ReportsSendWithWrongArrow) {
  expectProgramError(std::string(kProgramHead) + "device 0 {\n  send %y <- 1\n}\n", 8, 11,
                     {"expected '->'", "found '<-'"});
}

TEST(ParserErrors, ReportsRecvWithoutSourceDevice) {
  expectProgramError(std::string(kProgramHead) + "device 1 {\n  recv %y <-\n}\n", 9, 1,
                     {"expected source device", "found '}'"});
}

}  // namespace
}  // namespace modelpar::ir
