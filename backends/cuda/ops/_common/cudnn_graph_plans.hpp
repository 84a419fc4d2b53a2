// Plans of cuDNN frontend graphs for an op's cuDNN graph candidates (conv2d's cudnn_graph, attention's cudnn).
// Include only where GE2_WITH_CUDNN_FRONTEND is 1.
//
// Each problem's graph is built once with the first kMaxPlans plans that build from heuristics mode A's engines
// followed by cuDNN's fallback list (the sources and the limit PyTorch's cudnn.benchmark uses: for odd problems,
// such as a 3-channel stem, A offers few engines and the fastest can be on the fallback list); the first call
// times them on its own buffers (Graph::autotune) and keeps the fastest. Building and timing allocate and synchronize, so neither
// runs during CUDA graph capture. Callers hold CudnnHandles' call lock around everything here.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include <cudnn_frontend.h>

#include "cudnn_handle.hpp"
#include "stream_workspace.hpp"

namespace ge2::cudnn_graph {

namespace fe = cudnn_frontend;

// The tensors' device addresses by uid.
using VariantPack = std::unordered_map<int64_t, void*>;
// Adds a problem's tensors and nodes to an empty graph.
using AddNodes = std::function<void(fe::graph::Graph&)>;

// Plans asking for more workspace are left out: the per-stream workspace is kept for the life of the process.
constexpr int64_t kMaxWorkspaceBytes = int64_t{256} << 20;
// The first plans in heuristics order are built and timed (PyTorch's cudnn.benchmark_limit is 10 too): each build
// may compile a kernel (cuDNN's runtime-compiled engines), and the likely fastest come first.
constexpr int64_t kMaxPlans = 10;

struct GraphPlan {
  std::unique_ptr<fe::graph::Graph> graph;
  std::string missing;    // why cuDNN has no engine for the problem; empty when it has one
  bool tuned = false;     // autotuned: the fastest plan is selected
  int64_t workspace = 0;  // bytes, of the selected plan
};

inline std::string kernel_prefix(const char* kernel) {
  return std::string("ge2 op '") + GE2_OP_NAME + "': kernel '" + kernel + "': ";
}

// Adds the nodes and builds the first kMaxPlans plans of mode A's engines then the fallback list's, leaving out
// engines with an `excluded` numerical note; the frontend's message when none builds.
inline std::string build_plans(fe::graph::Graph& graph, const AddNodes& add_nodes,
                               const std::vector<fe::NumericalNote_t>& excluded, cudnnHandle_t handle) {
  add_nodes(graph);
  fe::error_t status = graph.validate();
  if (status.is_good()) status = graph.build_operation_graph(handle);
  if (status.is_good()) status = graph.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
  if (status.is_good()) {
    graph.deselect_numeric_notes(excluded).deselect_workspace_greater_than(kMaxWorkspaceBytes);
    status = graph.check_support();
  }
  if (status.is_bad()) return status.get_message();
  std::string failures;
  int64_t built = 0;
  for (int64_t index = 0; index < graph.get_execution_plan_count() && built < kMaxPlans; ++index) {
    fe::error_t plan_status = graph.build_plan_at_index(index);
    if (plan_status.is_good()) {
      ++built;
    } else {
      failures += " plan " + std::to_string(index) + ": " + plan_status.get_message() + ";";
    }
  }
  return built > 0 ? "" : "no plan built:" + failures;
}

class GraphPlans {
 public:
  static GraphPlans& instance() {
    static auto* plans = new GraphPlans();  // never destroyed: outlives Python's teardown order
    return *plans;
  }

  // The cached plans of the problem `key` (its graph from `add_nodes`), built on first use with `handle` (no
  // engine: `missing` says why). A call that enqueues on `stream` (`on_stream`, not prepare()) refuses to build
  // while the stream captures.
  GraphPlan& plan_for(const std::vector<int64_t>& key, const AddNodes& add_nodes,
                      const std::vector<fe::NumericalNote_t>& excluded, cudnnHandle_t handle, cudaStream_t stream,
                      bool on_stream, const char* kernel) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = plans_.find(key);
    if (found != plans_.end()) return *found->second;
    if (on_stream) refuse_cudnn_setup_during_capture(stream, kernel, "build its cuDNN plans");
    auto plan = std::make_unique<GraphPlan>();
    plan->graph = std::make_unique<fe::graph::Graph>();
    plan->missing = build_plans(*plan->graph, add_nodes, excluded, handle);
    if (!plan->missing.empty()) plan->graph.reset();
    return *plans_.emplace(key, std::move(plan)).first->second;
  }

 private:
  std::mutex mutex_;
  std::map<std::vector<int64_t>, std::unique_ptr<GraphPlan>> plans_;
};

// Times every plan on the call's buffers once (outside capture) and keeps the fastest. The workspace the timing
// needs is the largest plan's.
inline void tune(GraphPlan& plan, cudnnHandle_t handle, VariantPack& pack, cudaStream_t stream, const char* kernel) {
  if (plan.tuned) return;
  refuse_cudnn_setup_during_capture(stream, kernel, "time its cuDNN plans");
  const int64_t bytes = plan.graph->get_autotune_workspace_size();
  void* workspace = bytes > 0 ? StreamWorkspace::get(static_cast<std::size_t>(bytes), stream) : nullptr;
  fe::error_t status = plan.graph->autotune(handle, pack, workspace);
  if (status.is_bad()) throw std::runtime_error(kernel_prefix(kernel) + "timing the cuDNN plans failed: " +
                                                status.get_message());
  int64_t selected = 0;
  fe::error_t size_status = plan.graph->get_workspace_size(selected);
  if (size_status.is_bad()) throw std::runtime_error(kernel_prefix(kernel) + size_status.get_message());
  plan.workspace = selected;
  plan.tuned = true;
}

inline void execute(const GraphPlan& plan, cudnnHandle_t handle, VariantPack& pack, void* workspace,
                    const char* kernel) {
  fe::error_t status = plan.graph->execute(handle, pack, workspace);
  if (status.is_bad()) throw std::runtime_error(kernel_prefix(kernel) + "cuDNN execution failed: " +
                                                status.get_message());
}

inline std::string no_engine(const GraphPlan& plan) {
  return "cuDNN has no engine for this problem (" + plan.missing + ")";
}

// The plans assume 16-byte aligned tensors (the frontend's default alignment; its execute checks the pointers).
inline bool aligned(std::initializer_list<const void*> pointers) {
  return std::all_of(pointers.begin(), pointers.end(),
                     [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; });
}
constexpr const char* kMisaligned = "needs 16-byte aligned tensors (its cuDNN plans assume them); got an offset view";

}  // namespace ge2::cudnn_graph
