// Finding functional variants of mutating operators (functional.h).
#include "backend/functional.h"

#include <algorithm>
#include <mutex>
#include <string>
#include <unordered_map>

#include <ATen/core/Tensor.h>

namespace modelpar::backend {
namespace {

bool writes(const c10::Argument& a) {
  const c10::AliasInfo* info = aliasOf(a);
  return info && info->isWrite();
}

bool returnAliasesArg(const c10::Argument& ret, const c10::FunctionSchema& s) {
  return aliasedArg(s, ret) >= 0;
}

/// Overload names of every operator, by qualified name; built on first use.
const std::vector<std::string>& overloadsOf(const std::string& name) {
  static const auto* table = [] {
    auto* t = new std::unordered_map<std::string, std::vector<std::string>>();
    for (const c10::OperatorName& n : c10::Dispatcher::singleton().getAllOpNames()) {
      (*t)[n.name].push_back(n.overload_name);
    }
    return t;
  }();
  static const std::vector<std::string> none;
  auto it = table->find(name);
  return it == table->end() ? none : it->second;
}

/// Tries `cand` as the functional variant of `op` (schema `s`, writing `mutated`).
std::optional<FunctionalVariant> match(const c10::FunctionSchema& s, const std::vector<int>& mutated,
                                       const c10::OperatorHandle& cand) {
  const c10::FunctionSchema& f = cand.schema();
  if (f.is_mutable()) return std::nullopt;
  size_t fresh = 0;
  for (const c10::Argument& r : s.returns()) fresh += returnAliasesArg(r, s) ? 0 : 1;
  if (f.returns().size() != fresh + mutated.size()) return std::nullopt;

  FunctionalVariant fv{cand, {}, mutated, fresh};
  std::vector<bool> used(s.arguments().size(), false);
  for (const c10::Argument& p : f.arguments()) {
    int from = -1;
    for (size_t i = 0; i < s.arguments().size(); ++i) {
      const c10::Argument& a = s.arguments()[i];
      if (a.name() == p.name() && a.real_type()->str() == p.real_type()->str()) {
        from = static_cast<int>(i);
        break;
      }
    }
    if (from < 0 && !p.default_value()) return std::nullopt;
    if (from >= 0) used[static_cast<size_t>(from)] = true;
    fv.arg_from.push_back(from);
  }
  // Every input of the mutating op must reach the functional one, except the
  // pure outputs (out= arguments that are written and not read).
  for (size_t i = 0; i < s.arguments().size(); ++i) {
    const c10::Argument& a = s.arguments()[i];
    const bool pure_out = writes(a) && a.kwarg_only();
    if (!used[i] && !pure_out) return std::nullopt;
  }
  return fv;
}

std::optional<FunctionalVariant> search(const c10::OperatorHandle& op) {
  const c10::FunctionSchema& s = op.schema();
  std::vector<int> mutated;
  for (size_t i = 0; i < s.arguments().size(); ++i) {
    if (writes(s.arguments()[i])) mutated.push_back(static_cast<int>(i));
  }
  const std::string& name = s.name();
  std::vector<std::string> stems;
  if (name.size() > 1 && name.back() == '_' && name[name.size() - 2] != '_') {
    stems.push_back(name.substr(0, name.size() - 1));
    stems.push_back(stems.back() + "_functional");
  } else {
    stems.push_back(name);
    stems.push_back(name + "_functional");
  }
  for (const std::string& stem : stems) {
    std::vector<std::string> overloads = overloadsOf(stem);
    // Prefer the overload with the same name (add_.Tensor -> add.Tensor).
    std::stable_partition(overloads.begin(), overloads.end(),
                          [&](const std::string& o) { return o == s.overload_name(); });
    for (const std::string& o : overloads) {
      auto cand = c10::Dispatcher::singleton().findOp({stem, o});
      if (!cand) continue;
      if (auto fv = match(s, mutated, *cand)) return fv;
    }
  }
  return std::nullopt;
}

bool isNativeBatchNorm(const c10::FunctionSchema& s) {
  return s.name() == "aten::native_batch_norm" && s.overload_name().empty();
}

}  // namespace

const c10::AliasInfo* aliasOf(const c10::Argument& a) {
  const c10::AliasInfo* info = a.alias_info();
  if (!info) return nullptr;
  if (info->beforeSets().empty() && !info->containedTypes().empty()) return &info->containedTypes()[0];
  return info;
}

int aliasedArg(const c10::FunctionSchema& s, const c10::Argument& ret) {
  const c10::AliasInfo* r = aliasOf(ret);
  if (!r || r->beforeSets().empty()) return -1;
  for (size_t i = 0; i < s.arguments().size(); ++i) {
    const c10::AliasInfo* a = aliasOf(s.arguments()[i]);
    if (a && a->beforeSets() == r->beforeSets()) return static_cast<int>(i);
  }
  return -1;
}

bool writesArguments(const c10::FunctionSchema& schema) {
  return schema.is_mutable() || isNativeBatchNorm(schema);
}

bool mutatesMetadata(const c10::FunctionSchema& schema) {
  static const char* const kNames[] = {
      "aten::set_",      "aten::resize_",   "aten::resize_as_",       "aten::as_strided_",
      "aten::t_",        "aten::transpose_", "aten::squeeze_",        "aten::unsqueeze_",
      "aten::swapdims_", "aten::swapaxes_", "aten::_resize_output_", "aten::sparse_resize_",
      "aten::sparse_resize_and_clear_", "aten::resize_as_sparse_"};
  for (const char* n : kNames) {
    if (schema.name() == n) return true;
  }
  return false;
}

std::optional<FunctionalVariant> functionalVariant(const c10::OperatorHandle& op,
                                                   c10::ArrayRef<c10::IValue> args) {
  const c10::FunctionSchema& s = op.schema();
  // native_batch_norm(input, weight, bias, running_mean, running_var, training,
  // momentum, eps) updates the running statistics in training mode without
  // saying so; its functional form is _native_batch_norm_legit_functional
  // (same arguments), which returns the updated statistics last.
  if (isNativeBatchNorm(s)) {
    const bool training = args.size() > 5 && args[5].isBool() && args[5].toBool();
    const bool has_stats = args.size() > 4 && args[3].isTensor() && args[3].toTensor().defined() &&
                           args[4].isTensor() && args[4].toTensor().defined();
    if (!training || !has_stats) return std::nullopt;
    static const c10::OperatorHandle legit = c10::Dispatcher::singleton().findSchemaOrThrow(
        "aten::_native_batch_norm_legit_functional", "");
    return FunctionalVariant{legit, {0, 1, 2, 3, 4, 5, 6, 7}, {3, 4}, 3};
  }
  static std::mutex mu;
  static std::unordered_map<c10::OperatorName, std::optional<FunctionalVariant>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(op.operator_name());
  if (it == cache.end()) it = cache.emplace(op.operator_name(), search(op)).first;
  return it->second;
}

}  // namespace modelpar::backend
