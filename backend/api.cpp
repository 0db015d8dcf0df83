// The C++ API of include/modelpar/modelpar.h, over the capture session.
#include "modelpar/modelpar.h"

#include "backend/device.h"
#include "backend/session.h"

namespace modelpar {
namespace {
backend::Session& session() { return backend::Session::get(); }
}  // namespace

c10::Device device() {
  backend::nameDevice();  // Note [Naming the device is not free]
  return c10::Device(c10::DeviceType::PrivateUse1, 0);
}

void sync() { session().sync(); }

Options options() { return session().options(); }

void configure(const Options& o) { session().setOptions(o); }

void setOptions(const Options& o) { configure(o); }

Counters counters() {
  const backend::SessionCounters c = session().counters();
  return Counters{c.captures, c.replays, c.syncs, c.graph_breaks, c.ops_recorded, c.evictions};
}

void resetCounters() { session().resetCounters(); }

std::vector<PlanInfo> plans() {
  std::vector<PlanInfo> out;
  for (backend::PlanReport& p : session().plans()) {
    out.push_back(PlanInfo{std::move(p.graph), p.runs, std::move(p.summary)});
  }
  return out;
}

void clearPlans() { session().clearPlans(); }

std::string lastGraph() { return session().lastGraph(); }

std::string lastPlan() { return session().lastPlan(); }

void nameTensor(const at::Tensor& t, const std::string& name, TensorRole role) {
  const ir::InputRole r = role == TensorRole::Parameter ? ir::InputRole::Parameter
                          : role == TensorRole::Buffer  ? ir::InputRole::Buffer
                                                        : ir::InputRole::Input;
  session().nameTensor(t, name, r);
}

Scope::Scope(const std::string& name) { session().pushScope(name, /*absolute=*/false); }
Scope::~Scope() { session().popScope(); }

}  // namespace modelpar
