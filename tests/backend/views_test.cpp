// Views and in-place ops on the modelpar device: each program runs eagerly on
// the CPU and captured on modelpar, and every result must match. The captured
// graph must be functional: no in-place op survives in the IR.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <modelpar/modelpar.h>

#include "ir/error.h"

namespace {

using Program = std::function<std::vector<at::Tensor>(at::Tensor x, at::Tensor y)>;

/// Runs `f` on CPU tensors and on modelpar copies of them; returns the graph
/// the capture ran.
std::string expectSameAsEager(const Program& f) {
  at::manual_seed(0);
  const at::Tensor x = at::randn({4, 6});
  const at::Tensor y = at::randn({4, 6});
  std::vector<at::Tensor> want = f(x.clone(), y.clone());
  std::vector<at::Tensor> got = f(x.to(modelpar::device()), y.to(modelpar::device()));
  EXPECT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    EXPECT_EQ(got[i].device(), modelpar::device()) << "result " << i;
    at::Tensor g = got[i].to(at::kCPU);
    EXPECT_TRUE(at::allclose(g, want[i])) << "result " << i << "\nwant\n" << want[i] << "\ngot\n" << g
                                          << "\n" << modelpar::lastGraph();
  }
  return modelpar::lastGraph();
}

bool hasInPlaceOp(const std::string& graph) {
  // An IR op name ending in '_' ("aten::relu_(") or an out= overload.
  for (size_t p = graph.find("_("); p != std::string::npos; p = graph.find("_(", p + 1)) {
    size_t start = graph.rfind(' ', p);
    if (graph.compare(start + 1, 6, "aten::") == 0) return true;
  }
  return graph.find(".out(") != std::string::npos;
}

TEST(BackendViews, InPlaceOnBaseIsRecordedFunctionally) {
  std::string g = expectSameAsEager([](at::Tensor x, at::Tensor y) {
    x.relu_();
    x.add_(y, 2.0);
    x.mul_(0.5);
    return std::vector<at::Tensor>{x};
  });
  EXPECT_FALSE(hasInPlaceOp(g)) << g;
  EXPECT_NE(g.find("aten::relu("), std::string::npos) << g;
}

TEST(BackendViews, InPlaceThroughSliceScattersIntoTheBase) {
  std::string g = expectSameAsEager([](at::Tensor x, at::Tensor y) {
    at::Tensor v = x.slice(1, 1, 4);
    v.add_(1.0);
    at::Tensor r = x * 2;  // reads the base after the write
    return std::vector<at::Tensor>{x, v, r, y};
  });
  EXPECT_NE(g.find("aten::slice_scatter"), std::string::npos) << g;
  EXPECT_FALSE(hasInPlaceOp(g)) << g;
}

TEST(BackendViews, SlicingAssignmentFromTensorAndScalar) {
  using namespace at::indexing;
  expectSameAsEager([](at::Tensor x, at::Tensor y) {
    x.index_put_({Slice(), Slice(0, 2)}, y.index({Slice(), Slice(2, 4)}));  // x[:, 0:2] = y[:, 2:4]
    x.index_put_({1}, 7.0);                                                  // x[1] = 7
    x.index_put_({Slice(2, None), 5}, -1.0);                                 // x[2:, 5] = -1
    return std::vector<at::Tensor>{x};
  });
}

TEST(BackendViews, ViewsSeeWritesToTheirBase) {
  expectSameAsEager([](at::Tensor x, at::Tensor) {
    at::Tensor t = x.t();
    at::Tensor row = x.select(0, 2);
    at::Tensor flat = x.view({24});
    x.mul_(3.0);  // t, row and flat are stale now and must be rebuilt
    return std::vector<at::Tensor>{t.clone(), row + 1, flat.sum(0)};
  });
}

TEST(BackendViews, WriteThroughTransposeAndNestedViews) {
  expectSameAsEager([](at::Tensor x, at::Tensor y) {
    at::Tensor t = x.t();
    t.sub_(y.t());
    x.slice(0, 1, 3).select(1, 2).zero_();  // a view of a view
    std::vector<at::Tensor> parts = x.unbind(0);
    parts[3].fill_(4.0);  // one output of a multi-output view
    return std::vector<at::Tensor>{x, t, parts[0]};
  });
}

TEST(BackendViews, CopyFromCpuIntoAPartOfATracedTensor) {
  const at::Tensor cpu = at::arange(12, at::kFloat).reshape({2, 6});
  expectSameAsEager([&](at::Tensor x, at::Tensor y) {
    at::Tensor z = x + y;  // z is pending in the trace
    z.slice(0, 0, 2).copy_(cpu);
    return std::vector<at::Tensor>{z};
  });
}

TEST(BackendViews, OutVariantsAndForeachOps) {
  expectSameAsEager([](at::Tensor x, at::Tensor y) {
    at::Tensor out = at::empty_like(x);
    at::add_out(out, x, y, 3.0);
    std::vector<at::Tensor> a{x, y};
    std::vector<at::Tensor> b{y * 2, x * 2};
    at::_foreach_add_(a, b, -0.5);
    return std::vector<at::Tensor>{out, x, y};
  });
}

TEST(BackendViews, TypePromotingInPlaceKeepsTheDtype) {
  expectSameAsEager([](at::Tensor x, at::Tensor y) {
    at::Tensor h = x.to(at::kDouble);
    h.mul_(y);  // float64 *= float32 stays float64
    at::Tensor i = (x > 0).to(at::kLong);
    i.add_(2);
    return std::vector<at::Tensor>{h, i};
  });
}

TEST(BackendViews, UninitialisedTensorsFilledInPlace) {
  expectSameAsEager([](at::Tensor x, at::Tensor) {
    at::Tensor e = at::empty({4, 6}, x.options());
    e.fill_(2.5);
    at::Tensor z = at::zeros({3}, x.options());
    z.add_(1);
    return std::vector<at::Tensor>{e * x, z};
  });
}

TEST(BackendViews, InPlaceViewOpsAreRejected) {
  at::Tensor x = at::randn({2, 3}).to(modelpar::device());
  try {
    x.t_();
    FAIL() << "t_ should be rejected";
  } catch (const modelpar::UnsupportedOpError& e) {
    EXPECT_NE(std::string(e.what()).find("aten::t_"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("t()"), std::string::npos) << e.what();
  }
}

}  // namespace
