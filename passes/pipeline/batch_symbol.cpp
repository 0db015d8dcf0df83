// The batch dimension of a graph with symbolic shapes (batch_symbol.h).
#include "passes/pipeline/batch_symbol.h"

#include <algorithm>
#include <charconv>

#include "ir/check.h"

namespace modelpar::passes {
namespace {

// `s0`, or `s0_<k>`: the names fx_import gives the size inputs of symbol s0.
bool namesSymbol(const std::string& name, const std::string& symbol) {
  if (name.compare(0, symbol.size(), symbol) != 0) return false;
  if (name.size() == symbol.size()) return true;
  if (name.size() < symbol.size() + 2 || name[symbol.size()] != '_') return false;
  return std::all_of(name.begin() + static_cast<std::ptrdiff_t>(symbol.size()) + 1, name.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

constexpr std::string_view kWho = "modelpar microbatch";
// Operator letters of torch.compile's dimension names (fx_import.py `_dim`):
// '*' -> x, '+' -> p, '-' -> m, '/' -> d.
constexpr std::string_view kOpLetters = "xpmd";

bool plainSymbol(const ir::Dim& d) { return !d.isStatic() && d.symbol.rfind("e_", 0) != 0; }

// The operand tokens of an expression dimension's body, split at operator
// letters; empty when `symbol` itself contains one (then it cannot be split).
std::vector<std::pair<char, std::string>> terms(std::string_view body, const std::string& symbol) {
  std::vector<std::pair<char, std::string>> out;
  if (symbol.find_first_of(kOpLetters) != std::string::npos) return out;
  char op = 'p';
  std::string cur;
  for (char c : body) {
    if (kOpLetters.find(c) != std::string_view::npos) {
      out.emplace_back(op, cur);
      op = c;
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.emplace_back(op, cur);
  return out;
}

std::string describeInputs(const ir::Graph& g) {
  std::string s;
  for (const ir::Input& in : g.inputs()) {
    if (in.role != ir::InputRole::Input) continue;
    const ir::Value& v = g.value(in.value);
    s += fmt::format("{}%{}: {}", s.empty() ? "" : ", ", v.name, ir::toString(v.type));
  }
  return s.empty() ? "none" : s;
}

}  // namespace

bool dimMentions(const ir::Dim& d, const std::string& symbol) {
  if (d.isStatic()) return false;
  if (d.symbol == symbol) return true;
  if (d.symbol.rfind("e_", 0) != 0) return false;
  std::string_view body = std::string_view(d.symbol).substr(2);
  auto ts = terms(body, symbol);
  if (ts.empty()) return body.find(symbol) != std::string_view::npos;
  return std::any_of(ts.begin(), ts.end(), [&](const auto& t) { return t.second == symbol; });
}

std::optional<int64_t> evalDim(const ir::Dim& d, const std::string& symbol, int64_t value) {
  if (d.isStatic()) return d.size;
  if (d.symbol == symbol) return value;
  if (d.symbol.rfind("e_", 0) != 0) return std::nullopt;
  auto ts = terms(std::string_view(d.symbol).substr(2), symbol);
  if (ts.empty()) return std::nullopt;
  // Sum of products: '*' binds tighter than '+' and '-'; '/' is not evaluated.
  // Every step is checked: a size outside int64 is bad IR, not a wrapped number.
  auto overflow = [&](std::string_view what) {
    MP_THROW(InvalidIrError, "{}: dimension {} with {}={}: {} does not fit in int64", kWho,
             d.symbol, symbol, value, what);
  };
  int64_t sum = 0, product = 0;
  char sign = '+';
  for (size_t i = 0; i < ts.size(); ++i) {
    const auto& [op, tok] = ts[i];
    int64_t x = 0;
    if (tok == symbol) {
      x = value;
    } else if (!tok.empty() && std::all_of(tok.begin(), tok.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      auto [end, ec] = std::from_chars(tok.data(), tok.data() + tok.size(), x);
      if (ec != std::errc() || end != tok.data() + tok.size()) overflow(fmt::format("the number {}", tok));
    } else {
      return std::nullopt;
    }
    if (op == 'd') return std::nullopt;
    if (op == 'x' && i > 0) {
      if (__builtin_mul_overflow(product, x, &product)) overflow("the product");
      continue;
    }
    if (i > 0 && (sign == '+' ? __builtin_add_overflow(sum, product, &sum)
                              : __builtin_sub_overflow(sum, product, &sum))) {
      overflow("the sum");
    }
    sign = op == 'm' ? '-' : '+';
    product = x;
  }
  if (sign == '+' ? __builtin_add_overflow(sum, product, &sum)
                  : __builtin_sub_overflow(sum, product, &sum)) {
    overflow("the sum");
  }
  return sum;
}

int batchDimOf(const ir::Type& t, const std::string& symbol) {
  if (!t.isTensor()) return -1;
  for (size_t i = 0; i < t.shape.size(); ++i) {
    if (dimMentions(t.shape[i], symbol)) return static_cast<int>(i);
  }
  return -1;
}

ir::Type instantiate(const ir::Type& t, const std::string& symbol, int64_t value) {
  ir::Type out = t;
  for (ir::Dim& d : out.shape) {
    if (d.isStatic() || !dimMentions(d, symbol)) continue;
    if (std::optional<int64_t> n = evalDim(d, symbol, value)) d = ir::Dim::fixed(*n);
  }
  return out;
}

BatchSymbol findBatchSymbol(const ir::Graph& g, const std::string& symbol,
                            const std::vector<std::pair<std::string, int>>& dims) {
  const size_t ni = g.inputs().size();
  std::vector<std::optional<int>> forced(ni);
  for (const auto& [name, dim] : dims) {
    std::optional<ir::ValueId> v = g.findValue(name);
    std::optional<size_t> idx = v ? g.inputIndex(*v) : std::nullopt;
    MP_CHECK(idx.has_value(), ConfigError,
             "{}: graph @{}: batch_dims names '{}', which is not a graph input (inputs: {})", kWho,
             g.name(), name, describeInputs(g));
    const ir::Type& t = g.value(*v).type;
    MP_CHECK(dim == -1 || (t.isTensor() && dim >= 0 && dim < static_cast<int>(t.shape.size())),
             ConfigError, "{}: graph @{}: batch_dims gives %{} ({}) batch dim {}; use -1 (not "
             "batched) or a dim in [0, {})",
             kWho, g.name(), name, ir::toString(t), dim, t.isTensor() ? t.shape.size() : 0);
    MP_CHECK(dim == -1 || !t.shape[static_cast<size_t>(dim)].isStatic(), ConfigError,
             "{}: graph @{}: batch_dims puts the batch of %{} at dim {}, but its size there is "
             "static ({}); write that dim symbolically",
             kWho, g.name(), name, dim, ir::toString(t));
    forced[*idx] = dim;
  }
  BatchSymbol b;
  b.symbol = symbol;
  if (b.symbol.empty()) {
    std::vector<std::pair<std::string, std::string>> found;  // symbol, input
    for (size_t i = 0; i < ni; ++i) {
      const ir::Input& in = g.inputs()[i];
      const ir::Type& t = g.value(in.value).type;
      if (!t.isTensor() || (in.role != ir::InputRole::Input && !forced[i])) continue;
      int dim = forced[i].value_or(0);
      if (dim < 0 || static_cast<size_t>(dim) >= t.shape.size()) continue;
      const ir::Dim& d = t.shape[static_cast<size_t>(dim)];
      if (!plainSymbol(d)) continue;
      if (std::none_of(found.begin(), found.end(), [&](const auto& f) { return f.first == d.symbol; })) {
        found.emplace_back(d.symbol, g.value(in.value).name);
      }
    }
    MP_CHECK(!found.empty(), ConfigError,
             "{}: graph @{}: the batch dimension is static (inputs: {}). A static graph has the "
             "batch size baked into its constants (view sizes, the count a mean divides by), so "
             "it cannot be split exactly: write the batch dim symbolically (f32[B, 16]), or "
             "capture with torch.compile(..., dynamic=True); batch_symbol / batch_dims say "
             "where it is when it is not dim 0",
             kWho, g.name(), describeInputs(g));
    MP_CHECK(found.size() == 1, ConfigError,
             "{}: graph @{}: the inputs disagree on the batch symbol: %{} has {} and %{} has {} "
             "at their batch dim; set batch_symbol (and batch_dims)",
             kWho, g.name(), found[0].second, found[0].first, found[1].second, found[1].first);
    b.symbol = found[0].first;
  }
  b.input_dim.assign(ni, -1);
  for (size_t i = 0; i < ni; ++i) {
    const ir::Input& in = g.inputs()[i];
    const ir::Value& v = g.value(in.value);
    if (forced[i]) {
      b.input_dim[i] = *forced[i];
      MP_CHECK(*forced[i] < 0 || v.type.shape[static_cast<size_t>(*forced[i])].symbol == b.symbol,
               ConfigError, "{}: graph @{}: batch_dims puts the batch of %{} ({}) at dim {}, "
               "whose size is not the batch symbol {}",
               kWho, g.name(), v.name, ir::toString(v.type), *forced[i], b.symbol);
      continue;
    }
    if (v.type.kind == ir::Type::Kind::Int && namesSymbol(v.name, b.symbol)) {
      b.size_inputs.push_back(in.value);
    }
    if (!v.type.isTensor()) continue;
    for (size_t d = 0; d < v.type.shape.size(); ++d) {
      if (v.type.shape[d].symbol == b.symbol) {
        b.input_dim[i] = static_cast<int>(d);
        break;
      }
    }
  }
  MP_CHECK(std::any_of(b.input_dim.begin(), b.input_dim.end(), [](int d) { return d >= 0; }),
           ConfigError, "{}: graph @{}: no input has the batch symbol {} (inputs: {})", kWho,
           g.name(), b.symbol, describeInputs(g));
  return b;
}

bool BatchSymbol::isSizeInput(ir::ValueId v) const {
  return std::find(size_inputs.begin(), size_inputs.end(), v) != size_inputs.end();
}

}  // namespace modelpar::passes
