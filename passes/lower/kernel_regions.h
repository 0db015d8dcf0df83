// Kernel regions: Program + {node -> may be compiled} -> the same
// computation with each kernel region replaced by one node that calls a
// compiled kernel (issue 38, `options={"kernels": "inductor"}`).
//
// A kernel region is a maximal run of one device's `run` instructions of
// fusible nodes, of one phase and one micro-batch, with no `send` or `recv`
// between them (a `free` does not end a run). Between transfers, nothing
// another device waits for is produced inside the run, so compiling the run
// as one kernel delays no transfer; cutting at phase and micro-batch lets
// every micro-batch's region of a stage share one compiled artifact.
//
// Each region of at least `min_nodes` nodes becomes one node
//   %o1, %o2, ... = <op>(key, [%t1, %t2, ...], [%s1, ...])
// reading the region's inputs (values it reads that it does not define, in
// first-read order: the tensors, then the ints, such as a symbolic batch's
// sizes a view reads) and defining its outputs (values it defines that are
// read after it: by a node outside it, a `send`, or the graph's outputs; in
// definition order), with the outputs' names and types. The values defined
// and used only inside the region are gone: no slot, no free. The frees
// that stood inside the run follow the region's node, in their order.
// `key` is first_key, first_key + 1, ... in region order (device by device).
// The new node keeps the device, phase and micro-batch; its cost is the
// sum of the nodes' times, and its layer the nodes' common layer.
//
// Why the rewrite stays a valid program: a region is convex (no path leaves
// it and comes back), because such a path would pass a node of the same
// device inside the run (then it is in the region) or a `recv` inside the
// run (which ends it). So the graph with each region contracted to a node is
// still acyclic; nodes are emitted in topological order, ties broken by the
// original graph order. The result is verified (ir::verify).
//
// Does not: decide what may be compiled (the caller's mask; the Python side
// reads the operator schemas: functional ATen ops on tensors, no random
// op; so it is not a pass of the `opt` driver's registry), cost the compiled
// kernels for planning (regions are formed after planning and lowering), or
// fuse across transfers.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "ir/program.h"

namespace modelpar::passes {

struct KernelRegionOptions {
  /// Qualified operator of the region nodes; its schema is
  /// `(int key, Tensor[] inputs, SymInt[] sizes) -> Tensor[]`.
  std::string op = "modelpar_kernels::region";
  int first_key = 0;
  /// Runs shorter than this stay as they are (one op gains nothing from a
  /// compiler and pays a call).
  size_t min_nodes = 2;
};

/// One region, in the ids of the program it was found in (`nodes`,
/// `inputs`, `outputs`) and of the rewritten program (`node`).
struct KernelRegion {
  int key = 0;
  int device = 0;
  std::vector<ir::NodeId> nodes;     // in the device's order
  std::vector<ir::ValueId> inputs;   // the region node's inputs: tensors, then ints
  size_t num_tensor_inputs = 0;
  std::vector<ir::ValueId> outputs;  // the region node's outputs, in order
  ir::NodeId node = ir::kNoId;       // the region node in the new program
};

struct KernelRegions {
  ir::Program program;
  std::vector<KernelRegion> regions;
};

/// The regions of `p` among the nodes with `fusible[n]` true, each replaced
/// by one node (see above). InvalidIrError when `fusible` does not have one
/// entry per node, or admits a node reading a float or bool value; a program
/// without regions comes back unchanged.
KernelRegions fuseKernelRegions(const ir::Program& p, const std::vector<bool>& fusible,
                                const KernelRegionOptions& options = {});

/// The one-device program of a graph: device 0 runs every node in graph
/// order, with no frees (the form the one-device interpreter runs).
ir::Program oneDeviceProgram(const ir::Graph& g);

}  // namespace modelpar::passes
