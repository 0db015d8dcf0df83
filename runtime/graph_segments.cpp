// Cutting a Program into graph segments (graph_segments.h).
#include "runtime/graph_segments.h"

#include <map>
#include <queue>
#include <set>
#include <tuple>

#include "runtime/check.h"

namespace modelpar::runtime {
namespace {

using Kind = ir::Instruction::Kind;

struct Segments {
  std::vector<GraphSegment> seg;
  std::vector<int> parent;  // union-find over the initial segments
  std::vector<std::set<int>> out, in;

  int find(int x) {
    while (parent[static_cast<size_t>(x)] != x) x = parent[static_cast<size_t>(x)] = parent[static_cast<size_t>(parent[static_cast<size_t>(x)])];
    return x;
  }
  void edge(int a, int b) {
    if (a == b) return;
    out[static_cast<size_t>(a)].insert(b);
    in[static_cast<size_t>(b)].insert(a);
  }
  /// True when b is reachable from a by a path other than the edge a -> b.
  bool otherPath(int a, int b) {
    std::vector<int> stack;
    std::set<int> seen;
    for (int s : out[static_cast<size_t>(a)]) {
      if (s != b) stack.push_back(s);
    }
    while (!stack.empty()) {
      const int x = stack.back();
      stack.pop_back();
      if (x == b) return true;
      if (!seen.insert(x).second) continue;
      for (int s : out[static_cast<size_t>(x)]) stack.push_back(s);
    }
    return false;
  }
  /// Contracts b into a (b follows a on the same device).
  void merge(int a, int b) {
    const size_t ua = static_cast<size_t>(a), ub = static_cast<size_t>(b);
    for (int x : in[ub]) {
      out[static_cast<size_t>(x)].erase(b);
      if (x != a) edge(x, a);
    }
    for (int y : out[ub]) {
      in[static_cast<size_t>(y)].erase(b);
      edge(a, y);
    }
    out[ua].erase(b);
    in[ub].clear();
    out[ub].clear();
    seg[ua].end = seg[ub].end;
    parent[ub] = a;
  }
};

}  // namespace

std::vector<GraphSegment> graphSegments(const ir::Program& p) {
  const int n = p.numDevices();
  Segments s;
  // 1. Cut every list before each recv.
  std::vector<std::vector<int>> of_device(static_cast<size_t>(n));
  std::vector<std::vector<int>> at(static_cast<size_t>(n));  // instruction -> segment
  for (int d = 0; d < n; ++d) {
    const std::vector<ir::Instruction>& sched = p.schedule(d);
    at[static_cast<size_t>(d)].resize(sched.size());
    for (size_t i = 0; i < sched.size(); ++i) {
      if (i == 0 || sched[i].kind == Kind::Recv) {
        s.seg.push_back(GraphSegment{d, i, i});
        of_device[static_cast<size_t>(d)].push_back(static_cast<int>(s.seg.size() - 1));
      }
      s.seg.back().end = i + 1;
      at[static_cast<size_t>(d)][i] = static_cast<int>(s.seg.size() - 1);
    }
  }
  const size_t k = s.seg.size();
  s.parent.resize(k);
  for (size_t i = 0; i < k; ++i) s.parent[i] = static_cast<int>(i);
  s.out.resize(k);
  s.in.resize(k);

  // 2. Edges: program order on a device, and send -> matching recv.
  std::map<std::tuple<ir::ValueId, int, int>, int> send_at;  // (value, from, to) -> segment
  for (int d = 0; d < n; ++d) {
    const std::vector<ir::Instruction>& sched = p.schedule(d);
    for (size_t i = 0; i < sched.size(); ++i) {
      if (sched[i].kind == Kind::Send) send_at[{sched[i].value, d, sched[i].peer}] = at[static_cast<size_t>(d)][i];
    }
    const std::vector<int>& mine = of_device[static_cast<size_t>(d)];
    for (size_t j = 1; j < mine.size(); ++j) s.edge(mine[j - 1], mine[j]);
  }
  for (int d = 0; d < n; ++d) {
    const std::vector<ir::Instruction>& sched = p.schedule(d);
    for (size_t i = 0; i < sched.size(); ++i) {
      if (sched[i].kind != Kind::Recv) continue;
      auto it = send_at.find({sched[i].value, sched[i].peer, d});
      if (it != send_at.end()) s.edge(it->second, at[static_cast<size_t>(d)][i]);
    }
  }

  // 3. Merge consecutive segments of a device unless another device lies
  //    between them.
  for (int d = 0; d < n; ++d) {
    const std::vector<int>& mine = of_device[static_cast<size_t>(d)];
    for (size_t j = 1; j < mine.size(); ++j) {
      const int a = s.find(mine[j - 1]);
      const int b = mine[j];
      if (!s.otherPath(a, b)) s.merge(a, b);
    }
  }

  // 4. Launch order: Kahn's algorithm, lowest (device, begin) first.
  using Key = std::tuple<int, size_t, int>;
  std::priority_queue<Key, std::vector<Key>, std::greater<>> ready;
  std::vector<size_t> indegree(k);
  size_t roots = 0;
  for (size_t i = 0; i < k; ++i) {
    if (s.find(static_cast<int>(i)) != static_cast<int>(i)) continue;
    ++roots;
    indegree[i] = s.in[i].size();
    if (indegree[i] == 0) ready.emplace(s.seg[i].device, s.seg[i].begin, static_cast<int>(i));
  }
  std::vector<GraphSegment> order;
  while (!ready.empty()) {
    const int x = std::get<2>(ready.top());
    ready.pop();
    order.push_back(s.seg[static_cast<size_t>(x)]);
    for (int y : s.out[static_cast<size_t>(x)]) {
      if (--indegree[static_cast<size_t>(y)] == 0) {
        ready.emplace(s.seg[static_cast<size_t>(y)].device, s.seg[static_cast<size_t>(y)].begin, y);
      }
    }
  }
  MP_RT_CHECK(order.size() == roots, InvalidIrError,
              "modelpar graph replay: the program's sends and recvs form a cycle between devices "
              "(it would deadlock); ", order.size(), " of ", roots,
              " segments could be ordered; run ir::verify on it");
  return order;
}

std::string toString(const std::vector<GraphSegment>& segments) {
  std::string out;
  for (const GraphSegment& g : segments) {
    if (!out.empty()) out += ' ';
    out += c10::str('[', g.device, ':', g.begin, "..", g.end, ')');
  }
  return out;
}

}  // namespace modelpar::runtime
