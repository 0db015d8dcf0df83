// Recursive-descent parser of the IR text format (grammar in ir/README.md).
// Builds through the Graph API so that the builder's invariants hold; its
// InvalidIrErrors come back as ParseErrors at the offending token.
#include "ir/parser.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <limits>

#include "ir/error.h"
#include "ir/lexer.h"

namespace modelpar::ir {
namespace {

using Kind = Token::Kind;

constexpr int64_t kMinInt32 = std::numeric_limits<int32_t>::min();
constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();
constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();
constexpr int64_t kMinInt64 = std::numeric_limits<int64_t>::min();
// A sanity bound: Program allocates one schedule per device up front.
constexpr int64_t kMaxDevices = 1 << 16;
constexpr int kMaxListDepth = 32;

constexpr std::string_view kDtypeNames =
    "bool u8 i8 i16 i32 i64 f16 bf16 f32 f64 c64 c128 f8e4m3fn f8e5m2";

class Parser {
 public:
  explicit Parser(std::string_view text) : in_(tokenize(text)) {}

  Graph graph() {
    Graph g = parseGraphBody();
    if (!in_.atEnd()) in_.failExpected("end of input after the graph");
    return g;
  }

  Program program() {
    in_.expectName("program");
    in_.expectName("devices");
    in_.expectPunct("=");
    auto n = static_cast<int>(in_.expectInt("device count", 1, kMaxDevices));
    Program p(parseGraphBody(), n);
    std::vector<bool> seen(static_cast<size_t>(n), false);
    while (!in_.atEnd()) {
      if (!in_.peek().isName("device")) in_.failExpected("'device' block or end of input");
      in_.next();
      const Token& num = in_.expect(Kind::Int, "device number");
      int64_t d = 0;
      auto [end, ec] = std::from_chars(num.text.data(), num.text.data() + num.text.size(), d);
      if (ec != std::errc() || d < 0 || d >= n) {
        TokenCursor::fail(num, fmt::format("device block {} is out of range (program has {} "
                                           "device{})", num.text, n, n == 1 ? "" : "s"));
      }
      if (seen[static_cast<size_t>(d)]) {
        TokenCursor::fail(num, fmt::format("device block {} appears twice", d));
      }
      seen[static_cast<size_t>(d)] = true;
      in_.expectPunct("{");
      while (!in_.acceptPunct("}")) {
        p.append(static_cast<int>(d), parseInstruction(p.graph()));
      }
    }
    return p;
  }

 private:
  // Runs a Graph builder call; an InvalidIrError it throws becomes a
  // ParseError at `at` (the message loses the builder's "modelpar ir: ").
  template <typename F>
  auto build(const Token& at, F&& f) {
    try {
      return f();
    } catch (const ParseError&) {
      throw;
    } catch (const InvalidIrError& e) {
      std::string_view msg = e.what();
      constexpr std::string_view kPrefix = "modelpar ir: ";
      if (msg.substr(0, kPrefix.size()) == kPrefix) msg.remove_prefix(kPrefix.size());
      TokenCursor::fail(at, std::string(msg));
    }
  }

  Graph parseGraphBody() {
    in_.expectName("graph");
    in_.expectPunct("@");
    Graph g(in_.expect(Kind::Name, "graph name").text);
    in_.expectPunct("(");
    if (!in_.acceptPunct(")")) {
      do {
        parseInput(g);
      } while (in_.acceptPunct(","));
      in_.expectPunct(")");
    }
    in_.expectPunct("{");
    while (!in_.peek().isName("return")) parseNode(g);
    in_.next();
    std::vector<ValueId> outs;
    if (in_.peek().kind == Kind::Value) {
      do {
        outs.push_back(useValue(g));
      } while (in_.acceptPunct(","));
    }
    in_.expectPunct("}");
    g.setOutputs(std::move(outs));
    return g;
  }

  void parseInput(Graph& g) {
    const Token& name = in_.expect(Kind::Value, "input value (%name)");
    in_.expectPunct(":");
    Type type = parseType();
    const Token& role_tok = in_.expect(Kind::Name, "input role (input, param or buffer)");
    auto role = parseInputRole(role_tok.text);
    if (!role) {
      TokenCursor::fail(role_tok, fmt::format("unknown input role '{}' (known: input param buffer)",
                                              role_tok.text));
    }
    std::optional<int> device;
    if (in_.acceptPunct("{")) {
      do {
        const Token& key = in_.expect(Kind::Name, "attribute name");
        if (!key.isName("device")) {
          TokenCursor::fail(key, fmt::format("unknown input attribute '{}' (known: device)",
                                             key.text));
        }
        if (device) TokenCursor::fail(key, "attribute 'device' given twice");
        in_.expectPunct("=");
        device = static_cast<int>(in_.expectInt("device", kMinInt32, kMaxInt32));
      } while (in_.acceptPunct(","));
      in_.expectPunct("}");
    }
    build(name, [&] { return g.addInput(name.text, std::move(type), *role, device); });
  }

  Type parseType() {
    const Token& t = in_.expect(Kind::Name, "a type (dtype[dims], int, float or bool)");
    bool tensor = in_.peek().isPunct("[");
    if (!tensor) {
      if (t.text == "int") return Type::scalar(Type::Kind::Int);
      if (t.text == "float") return Type::scalar(Type::Kind::Float);
      if (t.text == "bool") return Type::scalar(Type::Kind::Bool);
    }
    auto dtype = parseScalarType(t.text);
    if (!dtype) {
      TokenCursor::fail(t, fmt::format("unknown dtype '{}' (known: {}; scalars: int float bool)",
                                       t.text, kDtypeNames));
    }
    in_.expectPunct("[");
    std::vector<Dim> dims;
    if (!in_.acceptPunct("]")) {
      do {
        if (in_.peek().kind == Kind::Name) {
          dims.push_back(Dim::symbolic(in_.next().text));
        } else {
          dims.push_back(Dim::fixed(in_.expectInt("dimension (an integer or a symbol)",
                                                  kMinInt64, kMaxInt64)));
        }
      } while (in_.acceptPunct(","));
      in_.expectPunct("]");
    }
    return Type::tensor(*dtype, std::move(dims));
  }

  void parseNode(Graph& g) {
    const Token& first = in_.peek();
    std::vector<std::pair<std::string, Type>> outs;
    const Token* label = nullptr;
    if (first.kind == Kind::Label) {
      label = &in_.next();
    } else if (first.kind == Kind::Value) {
      do {
        std::string name = in_.expect(Kind::Value, "result value (%name)").text;
        in_.expectPunct(":");
        outs.emplace_back(std::move(name), parseType());
      } while (in_.acceptPunct(","));
    } else {
      in_.failExpected("a node (%result: type = op(...) or ^label = op(...)) or 'return'");
    }
    in_.expectPunct("=");
    const Token& op_tok = in_.peek();
    std::string op = in_.expect(Kind::Name, "operator name (ns::op)").text;
    in_.expectPunct("::");
    op += "::" + in_.expect(Kind::Name, "operator name after '::'").text;
    if (in_.acceptPunct(".")) op += "." + in_.expect(Kind::Name, "overload name").text;
    in_.expectPunct("(");
    std::vector<Arg> args;
    if (!in_.acceptPunct(")")) {
      do {
        args.push_back(parseArg(g));
      } while (in_.acceptPunct(","));
      in_.expectPunct(")");
    }
    NodeId id = build(op_tok, [&] { return g.addNode(op, std::move(args), std::move(outs)); });
    if (label) build(*label, [&] { g.setLabel(id, label->text); });
    if (in_.peek().isPunct("{")) parseNodeAttrs(g.node(id));
  }

  void parseNodeAttrs(Node& n) {
    in_.expectPunct("{");
    constexpr size_t kCount = 6;
    bool seen[kCount] = {};
    constexpr std::string_view kNames[kCount] = {"layer", "phase", "device", "mb", "cost", "random"};
    do {
      const Token& key = in_.expect(Kind::Name, "attribute name");
      size_t k = 0;
      while (k < kCount && kNames[k] != key.text) ++k;
      if (k == kCount) {
        TokenCursor::fail(key, fmt::format("unknown attribute '{}' (known: layer, phase, device, "
                                           "mb, cost, random)", key.text));
      }
      if (seen[k]) TokenCursor::fail(key, fmt::format("attribute '{}' given twice", key.text));
      seen[k] = true;
      in_.expectPunct("=");
      if (k == 0) {
        n.layer = in_.expect(Kind::String, "layer name (a string)").text;
      } else if (k == 1) {
        const Token& p = in_.expect(Kind::Name, "phase (fwd, bwd, recompute or update)");
        n.phase = parsePhase(p.text);
        if (!n.phase) {
          TokenCursor::fail(p, fmt::format("unknown phase '{}' (known: fwd bwd recompute update)",
                                           p.text));
        }
      } else if (k == 2) {
        n.device = static_cast<int>(in_.expectInt("device", kMinInt32, kMaxInt32));
      } else if (k == 3) {
        n.microbatch = static_cast<int>(in_.expectInt("micro-batch", kMinInt32, kMaxInt32));
      } else if (k == 5) {
        // A mark, not a setting: a node that does not draw has no attribute.
        const Token& v = in_.peek();
        if (!v.isName("true")) {
          TokenCursor::fail(v, "attribute 'random' takes only random=true (a node that does not "
                               "draw random numbers is written without it)");
        }
        in_.expect(Kind::Name, "true");
        n.random = true;
      } else {
        n.cost = parseCost();
      }
    } while (in_.acceptPunct(","));
    in_.expectPunct("}");
  }

  // `{time_us=N, out=I, temp=I, persist=I}`, fields in that order.
  Cost parseCost() {
    auto field = [&](std::string_view key) {
      in_.expectName(key);
      in_.expectPunct("=");
    };
    Cost c;
    in_.expectPunct("{");
    field("time_us");
    c.time_us = parseNumber("time in microseconds");
    in_.expectPunct(",");
    field("out");
    c.output_bytes = in_.expectInt("output bytes", kMinInt64, kMaxInt64);
    in_.expectPunct(",");
    field("temp");
    c.temp_bytes = in_.expectInt("temp bytes", kMinInt64, kMaxInt64);
    in_.expectPunct(",");
    field("persist");
    c.persistent_bytes = in_.expectInt("persistent bytes", kMinInt64, kMaxInt64);
    in_.expectPunct("}");
    return c;
  }

  // INT, FLOAT, `inf`, `-inf` or `nan`, as a double.
  double parseNumber(std::string_view what) {
    const Token& t = in_.peek();
    if (t.isName("inf")) return in_.next(), std::numeric_limits<double>::infinity();
    if (t.isName("nan")) return in_.next(), std::numeric_limits<double>::quiet_NaN();
    if (t.kind == Kind::Float && t.text == "-inf") {
      return in_.next(), -std::numeric_limits<double>::infinity();
    }
    if (t.kind != Kind::Float && t.kind != Kind::Int) in_.failExpected(what);
    double v = 0;
    auto [end, ec] = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
    if (ec != std::errc() || end != t.text.data() + t.text.size()) {
      TokenCursor::fail(t, fmt::format("number {} is out of range for a double", t.text));
    }
    in_.next();
    return v;
  }

  Arg parseArg(const Graph& g) {
    if (in_.peek().kind == Kind::Name && in_.peek(1).isPunct("=")) {
      std::string keyword = in_.next().text;
      in_.next();
      return parseArgValue(g).withKeyword(std::move(keyword));
    }
    return parseArgValue(g);
  }

  Arg parseArgValue(const Graph& g) {
    const Token& t = in_.peek();
    switch (t.kind) {
      case Kind::Value:
        return Arg::value(useValue(g));
      case Kind::Int:
        return Arg::integer(in_.expectInt("integer", kMinInt64, kMaxInt64));
      case Kind::Float:
        return Arg::floating(parseNumber("number"));
      case Kind::String:
        return Arg::string(in_.next().text);
      case Kind::Punct:
        if (t.isPunct("[")) {
          // Bounded so that hostile text cannot overflow the stack (ATen
          // schemas nest lists two deep at most).
          if (list_depth_ >= kMaxListDepth) {
            TokenCursor::fail(t, fmt::format("lists nest deeper than {} levels", kMaxListDepth));
          }
          in_.next();
          ++list_depth_;
          std::vector<Arg> items;
          if (!in_.acceptPunct("]")) {
            do {
              items.push_back(parseArgValue(g));
            } while (in_.acceptPunct(","));
            in_.expectPunct("]");
          }
          --list_depth_;
          return Arg::list(std::move(items));
        }
        break;
      case Kind::Name:
        return parseNamedArg();
      default:
        break;
    }
    in_.failExpected("an argument");
  }

  // Arguments spelled with a word: None true false inf nan dtype.X layout.X
  // memory_format.X device("...").
  Arg parseNamedArg() {
    const Token& t = in_.peek();
    if (t.text == "None") return in_.next(), Arg::none();
    if (t.text == "true") return in_.next(), Arg::boolean(true);
    if (t.text == "false") return in_.next(), Arg::boolean(false);
    if (t.text == "inf" || t.text == "nan") return Arg::floating(parseNumber("number"));
    if (t.text == "device") {
      in_.next();
      in_.expectPunct("(");
      std::string d = in_.expect(Kind::String, "device string, e.g. \"cuda:0\"").text;
      in_.expectPunct(")");
      return Arg::device(std::move(d));
    }
    if (t.text == "dtype" || t.text == "layout" || t.text == "memory_format") {
      std::string kind = in_.next().text;
      in_.expectPunct(".");
      const Token& v = in_.expect(Kind::Name, fmt::format("{} name", kind));
      if (kind == "dtype") {
        if (auto d = parseScalarType(v.text)) return Arg::dtype(*d);
        TokenCursor::fail(v, fmt::format("unknown dtype '{}' (known: {})", v.text, kDtypeNames));
      }
      if (kind == "layout") {
        if (auto l = parseLayout(v.text)) return Arg::layout(*l);
        TokenCursor::fail(v, fmt::format("unknown layout '{}' (known: strided sparse_coo "
                                         "sparse_csr mkldnn)", v.text));
      }
      if (auto m = parseMemoryFormat(v.text)) return Arg::memoryFormat(*m);
      TokenCursor::fail(v, fmt::format("unknown memory format '{}' (known: contiguous_format "
                                       "preserve_format channels_last channels_last_3d)", v.text));
    }
    TokenCursor::fail(t, fmt::format("unknown argument word '{}' (known: None true false inf nan "
                                     "dtype.X layout.X memory_format.X device(\"...\"))", t.text));
  }

  // A `%name` that must already be defined.
  ValueId useValue(const Graph& g) {
    const Token& t = in_.expect(Kind::Value, "value (%name)");
    auto v = g.findValue(t.text);
    if (!v) {
      TokenCursor::fail(t, fmt::format("value %{} is used before it is defined", t.text));
    }
    return *v;
  }

  Instruction parseInstruction(const Graph& g) {
    const Token& t = in_.expect(Kind::Name, "instruction (run, send, recv or free) or '}'");
    if (t.text == "run") {
      if (in_.peek().kind == Kind::Label) {
        const Token& l = in_.next();
        auto n = g.findLabel(l.text);
        if (!n) TokenCursor::fail(l, fmt::format("no node is labelled ^{}", l.text));
        return Instruction::run(*n);
      }
      const Token& vt = in_.peek();
      ValueId v = useValue(g);
      const Value& val = g.value(v);
      if (val.producer == kNoId) {
        TokenCursor::fail(vt, fmt::format("run %{}: %{} is a graph input, not a node output",
                                          vt.text, vt.text));
      }
      if (val.output_index != 0) {
        TokenCursor::fail(vt, fmt::format("run %{}: %{} is output {} of its node; refer to a node "
                                          "by its first output {}", vt.text, vt.text,
                                          val.output_index, g.nodeRef(val.producer)));
      }
      return Instruction::run(val.producer);
    }
    if (t.text == "send" || t.text == "recv") {
      bool send = t.text == "send";
      ValueId v = useValue(g);
      in_.expectPunct(send ? "->" : "<-");
      // The peer's range is the verifier's to check, as for `device=` attributes.
      auto peer = static_cast<int>(
          in_.expectInt(send ? "destination device" : "source device", kMinInt32, kMaxInt32));
      return send ? Instruction::send(v, peer) : Instruction::recv(v, peer);
    }
    if (t.text == "free") return Instruction::free(useValue(g));
    TokenCursor::fail(t, fmt::format("unknown instruction '{}' (known: run send recv free)",
                                     t.text));
  }

  TokenCursor in_;
  int list_depth_ = 0;  // lists open around the argument being parsed
};

}  // namespace

Graph parseGraph(std::string_view text) { return Parser(text).graph(); }

Program parseProgram(std::string_view text) { return Parser(text).program(); }

}  // namespace modelpar::ir
