// Streams (owned, or wrapping a foreign handle from PyTorch/CuPy), events, and CUDA graph capture/replay.
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>
#include <pybind11/stl.h>

#include "device_array.hpp"
#include "devices.hpp"
#include "status.hpp"
#include "streams.hpp"

namespace ge2::runtime {
namespace {

cudaStream_t as_stream(std::uintptr_t handle) { return reinterpret_cast<cudaStream_t>(handle); }

class Stream {
 public:
  // handle == 0 is the legacy default stream; an owned stream is created non-blocking on `device`.
  Stream(std::uintptr_t handle, int device, bool owned) : handle_(handle), device_(device), owned_(owned) {}
  ~Stream() {
    if (owned_) cudaStreamDestroy(as_stream(handle_));
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  static std::unique_ptr<Stream> create(int device, int priority) {
    device = resolve_device(device);
    DeviceGuard guard(device);
    cudaStream_t stream = nullptr;
    GE2_CUDA_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, priority));
    return std::make_unique<Stream>(reinterpret_cast<std::uintptr_t>(stream), device, true);
  }

  void synchronize() const {
    py::gil_scoped_release release;
    GE2_CUDA_CHECK(cudaStreamSynchronize(as_stream(handle_)));
  }
  bool query() const {
    const cudaError_t status = cudaStreamQuery(as_stream(handle_));
    if (status == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    GE2_CUDA_CHECK(status);
    return true;
  }
  std::uintptr_t handle() const { return handle_; }
  int device() const { return device_; }
  bool owned() const { return owned_; }

 private:
  std::uintptr_t handle_;
  int device_;
  bool owned_;
};

class Event {
 public:
  explicit Event(bool timing) {
    require_device(0);
    GE2_CUDA_CHECK(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  ~Event() { cudaEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(std::uintptr_t stream) { GE2_CUDA_CHECK(cudaEventRecord(event_, as_stream(stream))); }
  void synchronize() const {
    py::gil_scoped_release release;
    GE2_CUDA_CHECK(cudaEventSynchronize(event_));
  }
  bool query() const {
    const cudaError_t status = cudaEventQuery(event_);
    if (status == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    GE2_CUDA_CHECK(status);
    return true;
  }
  // Milliseconds from this event to `end` (both recorded, both completed).
  float elapsed_ms(const Event& end) const {
    float ms = 0.0f;
    GE2_CUDA_CHECK(cudaEventElapsedTime(&ms, event_, end.event_));
    return ms;
  }
  void wait_on(std::uintptr_t stream) const { GE2_CUDA_CHECK(cudaStreamWaitEvent(as_stream(stream), event_, 0)); }

 private:
  cudaEvent_t event_ = nullptr;
};

// Captures the work enqueued on one stream (and on the streams it forks to through events, joined back before the
// end) between begin_capture and end_capture, then replays it with a single launch. Capturing on the legacy default
// stream (handle 0) is not allowed by CUDA.
class CudaGraph {
 public:
  CudaGraph() = default;
  ~CudaGraph() {
    // Dropped mid-capture (its owner raised without abort_capture): the thread's deferred frees must not wait for
    // an end_capture that will never come.
    if (capture_stream_ != 0) capture_ends();
    reset();
  }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  void begin_capture(std::uintptr_t stream) {
    if (stream == 0) throw std::invalid_argument("stream: graph capture needs a non-default stream, got 0");
    reset();
    GE2_CUDA_CHECK(cudaStreamBeginCapture(as_stream(stream), cudaStreamCaptureModeThreadLocal));
    capture_stream_ = stream;
    capture_begins();
  }

  void end_capture() {
    if (capture_stream_ == 0) throw std::logic_error("end_capture without begin_capture");
    cudaGraph_t graph = nullptr;
    const cudaError_t status = cudaStreamEndCapture(as_stream(capture_stream_), &graph);
    capture_stream_ = 0;
    capture_ends();
    if (status != cudaSuccess && graph != nullptr) cudaGraphDestroy(graph);
    GE2_CUDA_CHECK(status);
    graph_ = graph;
    GE2_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
  }

  // Ends a capture that failed part way (a call that is not allowed during capture invalidates it): the partial
  // graph is dropped and the error state cleared, so the stream can run work uncaptured again.
  void abort_capture() {
    if (capture_stream_ != 0) {
      cudaGraph_t graph = nullptr;
      cudaStreamEndCapture(as_stream(capture_stream_), &graph);
      if (graph != nullptr) cudaGraphDestroy(graph);
      capture_stream_ = 0;
      capture_ends();
    }
    cudaGetLastError();
    reset();
  }

  // Launches the graph on `stream` (any stream, the legacy one included): one call, no host synchronisation.
  void replay(std::uintptr_t stream) {
    if (exec_ == nullptr) throw std::logic_error("replay: nothing has been captured");
    GE2_CUDA_CHECK(cudaGraphLaunch(exec_, as_stream(stream)));
  }

  // (destination, source, bytes): a copy between device memory and device or page-locked host memory.
  using Copy = std::tuple<std::uintptr_t, std::uintptr_t, std::size_t>;

  // A new graph that runs the `before` copies, then this captured graph (as a child graph node), then the `after`
  // copies: a plan's feeds and fetches as memcpy nodes, so that a run is one launch. set_copy changes a copy's
  // addresses in the instantiated graph (copies numbered `before` first), with no new instantiation.
  std::unique_ptr<CudaGraph> with_copies(const std::vector<Copy>& before, const std::vector<Copy>& after) const {
    if (graph_ == nullptr) throw std::logic_error("with_copies: nothing has been captured");
    auto result = std::make_unique<CudaGraph>();
    GE2_CUDA_CHECK(cudaGraphCreate(&result->graph_, 0));  // owned by `result` from here: freed if a step throws
    std::vector<cudaGraphNode_t> feeds;
    for (const auto& copy : before) feeds.push_back(result->add_copy(copy, nullptr, 0));
    cudaGraphNode_t body = nullptr;
    GE2_CUDA_CHECK(cudaGraphAddChildGraphNode(&body, result->graph_, feeds.data(), feeds.size(), graph_));
    for (const auto& copy : after) result->add_copy(copy, &body, 1);
    GE2_CUDA_CHECK(cudaGraphInstantiate(&result->exec_, result->graph_, 0));
    return result;
  }

  // Points copy `index` of a with_copies graph at new addresses for the next launches (launches already enqueued
  // keep the old ones). False, with the error cleared, when CUDA refuses (the memory is of another kind than at
  // instantiation): the caller copies outside the graph instead.
  bool set_copy(std::size_t index, std::uintptr_t destination, std::uintptr_t source, std::size_t nbytes) {
    if (index >= copies_.size()) {
      throw std::out_of_range("index: expected < " + std::to_string(copies_.size()) + " copies, got " +
                              std::to_string(index));
    }
    const cudaError_t status =
        cudaGraphExecMemcpyNodeSetParams1D(exec_, copies_[index], reinterpret_cast<void*>(destination),
                                           reinterpret_cast<const void*>(source), nbytes, cudaMemcpyDefault);
    if (status == cudaSuccess) return true;
    cudaGetLastError();
    return false;
  }

  bool captured() const { return exec_ != nullptr; }

  std::size_t node_count() const {
    if (graph_ == nullptr) return 0;
    std::size_t count = 0;
    GE2_CUDA_CHECK(cudaGraphGetNodes(graph_, nullptr, &count));
    return count;
  }

  // How many nodes of each kind the graph holds ("kernel", "memset", "memcpy", ...): what a captured step launches
  // besides its kernels.
  std::map<std::string, std::size_t> node_types() const {
    std::map<std::string, std::size_t> counts;
    std::size_t count = node_count();
    std::vector<cudaGraphNode_t> nodes(count);
    if (count > 0) GE2_CUDA_CHECK(cudaGraphGetNodes(graph_, nodes.data(), &count));
    for (cudaGraphNode_t node : nodes) {
      cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
      GE2_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
      ++counts[node_type_name(type)];
    }
    return counts;
  }

 private:
  static std::string node_type_name(cudaGraphNodeType type) {
    switch (type) {
      case cudaGraphNodeTypeKernel: return "kernel";
      case cudaGraphNodeTypeMemcpy: return "memcpy";
      case cudaGraphNodeTypeMemset: return "memset";
      case cudaGraphNodeTypeHost: return "host";
      case cudaGraphNodeTypeGraph: return "graph";
      case cudaGraphNodeTypeEmpty: return "empty";
      case cudaGraphNodeTypeWaitEvent: return "wait_event";
      case cudaGraphNodeTypeEventRecord: return "event_record";
      case cudaGraphNodeTypeMemAlloc: return "mem_alloc";
      case cudaGraphNodeTypeMemFree: return "mem_free";
      default: return "other (type " + std::to_string(static_cast<int>(type)) + ")";
    }
  }

  void reset() {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
    if (graph_ != nullptr) cudaGraphDestroy(graph_);
    exec_ = nullptr;
    graph_ = nullptr;
    copies_.clear();
  }

  cudaGraphNode_t add_copy(const Copy& copy, const cudaGraphNode_t* dependencies, std::size_t count) {
    const auto& [destination, source, nbytes] = copy;
    cudaGraphNode_t node = nullptr;
    GE2_CUDA_CHECK(cudaGraphAddMemcpyNode1D(&node, graph_, dependencies, count, reinterpret_cast<void*>(destination),
                                            reinterpret_cast<const void*>(source), nbytes, cudaMemcpyDefault));
    copies_.push_back(node);
    return node;
  }

  std::uintptr_t capture_stream_ = 0;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  std::vector<cudaGraphNode_t> copies_;  // with_copies: the memcpy nodes, in set_copy's numbering
};

// NVTX ranges in the "ge2" domain (NVTX3 is header-only: without a profiler attached each call returns at once).
nvtxDomainHandle_t nvtx_domain() {
  static nvtxDomainHandle_t domain = nvtxDomainCreateA("ge2");
  return domain;
}

void nvtx_push(const std::string& message) {
  nvtxEventAttributes_t attributes{};
  attributes.version = NVTX_VERSION;
  attributes.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  attributes.messageType = NVTX_MESSAGE_TYPE_ASCII;
  attributes.message.ascii = message.c_str();
  nvtxDomainRangePushEx(nvtx_domain(), &attributes);
}

void nvtx_pop() { nvtxDomainRangePop(nvtx_domain()); }

}  // namespace

void register_streams(py::module_& m) {
  py::class_<Stream>(m, "Stream", "A CUDA stream: owned (created here) or wrapping a foreign handle.")
      .def(py::init(&Stream::create), py::arg("device") = kCurrentDevice, py::arg("priority") = 0,
           "Creates a non-blocking stream on `device`.")
      .def_static(
          "wrap",
          [](std::uintptr_t handle, int device) {
            return std::make_unique<Stream>(handle, resolve_device(device), false);
          },
          py::arg("handle"), py::arg("device") = kCurrentDevice,
          "Wraps a stream owned elsewhere (e.g. torch.cuda.Stream.cuda_stream, cupy Stream.ptr); not destroyed "
          "here.")
      .def_static(
          "default", [](int device) { return std::make_unique<Stream>(0, resolve_device(device), false); },
          py::arg("device") = kCurrentDevice,
          "The legacy default stream.")
      .def("synchronize", &Stream::synchronize)
      .def("query", &Stream::query, "True when all enqueued work has completed.")
      .def_property_readonly("handle", &Stream::handle, "cudaStream_t as an integer.")
      .def_property_readonly("device", &Stream::device)
      .def_property_readonly("owned", &Stream::owned)
      .def("__repr__", [](const Stream& s) {
        return "Stream(handle=" + std::to_string(s.handle()) + ", device=" + std::to_string(s.device()) +
               (s.owned() ? ", owned)" : ", borrowed)");
      });

  py::class_<Event>(m, "Event")
      .def(py::init<bool>(), py::arg("timing") = true)
      .def("record", &Event::record, py::arg("stream") = 0)
      .def("synchronize", &Event::synchronize)
      .def("query", &Event::query)
      .def("elapsed_ms", &Event::elapsed_ms, py::arg("end"), "Milliseconds from this event to `end`.")
      .def("wait_on", &Event::wait_on, py::arg("stream"), "Makes `stream` wait for this event.");

  py::class_<CudaGraph>(m, "CudaGraph", "Stream capture into a CUDA graph, replayed with one launch.")
      .def(py::init<>())
      .def("begin_capture", &CudaGraph::begin_capture, py::arg("stream"))
      .def("end_capture", &CudaGraph::end_capture)
      .def("abort_capture", &CudaGraph::abort_capture,
           "Drops a failed capture and clears the error, so the stream runs uncaptured work again.")
      .def("replay", &CudaGraph::replay, py::arg("stream"), "Launches the graph on `stream` (0: the legacy one).")
      .def("with_copies", &CudaGraph::with_copies, py::arg("before"), py::arg("after"),
           "A new graph: the `before` copies (destination, source, bytes), this graph, then the `after` copies; "
           "device or page-locked host memory.")
      .def("set_copy", &CudaGraph::set_copy, py::arg("index"), py::arg("destination"), py::arg("source"),
           py::arg("nbytes"), "Changes a with_copies copy's addresses for later launches; False when CUDA refuses.")
      .def_property_readonly("captured", &CudaGraph::captured)
      .def_property_readonly("node_count", &CudaGraph::node_count)
      .def_property_readonly("node_types", &CudaGraph::node_types,
                             "{kind: count} of the captured graph's nodes: 'kernel', 'memset', 'memcpy', ...");

  m.def("nvtx_push", &nvtx_push, py::arg("message"), "Opens an NVTX range in the 'ge2' domain.");
  m.def("nvtx_pop", &nvtx_pop, "Closes the innermost NVTX range of the 'ge2' domain.");
}

}  // namespace ge2::runtime
