// Streams (owned, or wrapping a foreign handle from PyTorch/CuPy), events, and CUDA graph capture/replay.
#include <cstdint>
#include <memory>
#include <string>

#include <nvtx3/nvToolsExt.h>

#include "runtime.hpp"

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

  bool captured() const { return exec_ != nullptr; }

  std::size_t node_count() const {
    if (graph_ == nullptr) return 0;
    std::size_t count = 0;
    GE2_CUDA_CHECK(cudaGraphGetNodes(graph_, nullptr, &count));
    return count;
  }

 private:
  void reset() {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
    if (graph_ != nullptr) cudaGraphDestroy(graph_);
    exec_ = nullptr;
    graph_ = nullptr;
  }

  std::uintptr_t capture_stream_ = 0;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
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
      .def_property_readonly("captured", &CudaGraph::captured)
      .def_property_readonly("node_count", &CudaGraph::node_count);

  m.def("nvtx_push", &nvtx_push, py::arg("message"), "Opens an NVTX range in the 'ge2' domain.");
  m.def("nvtx_pop", &nvtx_pop, "Closes the innermost NVTX range of the 'ge2' domain.");
}

}  // namespace ge2::runtime
