// optimizer: fused multi-tensor SGD / Adam / AdamW steps with device-side schedules, global-norm clipping and
// dynamic loss scaling. Every launch walks a device-resident chunk table, so one launch updates every tensor of a
// dtype group whatever their number and sizes; nothing the step needs comes from the host, so it can be captured.
//
// One optimizer step is, in stream order:
//   grad_norm (per dtype group, only with clipping or loss scaling): per-chunk sums of squares -> partials
//   finalize  (once): partials -> global norm, overflow / non-finite check, step counter, schedule, scaler update -> Control
//   step      (per dtype group): the parameter update, reading its scalars from Control
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "dtype.hpp"
#include "kernel_info.hpp"

namespace ge2::optimizer {

// One row of the tensor table (device memory, built once by the caller). Absent pointers are 0.
struct TensorEntry {
  uint64_t param;   // float32 master weights, updated in place
  uint64_t grad;    // float32 / float16 / bfloat16 gradients (the group's grad dtype), read only
  uint64_t state0;  // SGD: momentum buffer; Adam: exp_avg (float32)
  uint64_t state1;  // Adam: exp_avg_sq (float32)
  uint64_t state2;  // Adam with amsgrad: max_exp_avg_sq (float32)
  uint64_t low;     // low-precision copy of param written after the update (the group's low dtype), or 0
  int64_t numel;
  int64_t reserved;
};
static_assert(sizeof(TensorEntry) == 64, "the Python side builds this table as int64[8] rows");

// One row of the chunk table: block b updates elements [start, min(start + chunk_size, numel)) of tensor `tensor`.
struct ChunkEntry {
  int64_t tensor;
  int64_t start;
};

// Device-resident step state (64 bytes). The caller allocates and initializes it once; the kernels own it after.
struct Control {
  int64_t step;        // applied optimizer steps (skipped steps do not count); Adam's bias corrections use it
  int64_t good_steps;  // finite steps since the loss scale last changed
  float loss_scale;    // dynamic loss scale (grads arrive multiplied by it)
  float grad_norm;     // global L2 norm of the unscaled gradients of the last step (0 without a norm pass)
  float lr;            // learning rate of the last applied step
  int32_t skipped;     // 1: the last step found an inf/NaN gradient and changed nothing
  int32_t nonfinite;   // set by grad_norm, consumed and reset by finalize
  float inv_scale;     // 1 / loss_scale as the step kernels apply it (the scale before this step's update)
  float clip_coef;     // min(1, max_norm / (norm + 1e-6)), 1 without clipping
  float step_size;     // -lr / (1 - beta1^step) (Adam) or -lr (SGD)
  float bias_correction2_sqrt;  // sqrt(1 - beta2^step) (Adam)
  float decay;                  // 1 - lr * weight_decay (AdamW)
  int32_t nonfinite_steps;      // steps dropped for a non-finite gradient (skip_nonfinite without loss scaling)
  int32_t first_nonfinite;      // the attempt (step + nonfinite_steps) of the first of them since the host reset it
};
static_assert(sizeof(Control) == 64, "Control is 64 bytes");

enum class Algorithm { SGD = 0, Adam = 1 };
enum class Schedule { Constant = 0, LinearWarmup = 1, Cosine = 2 };

// The tables of one dtype group, as both the norm pass and the step walk them.
struct GroupTables {
  const TensorEntry* tensors = nullptr;
  const ChunkEntry* chunks = nullptr;
  int64_t num_chunks = 0, chunk_size = 0;
  DType grad_dtype = DType::Float32;
};

struct NormArgs {
  GroupTables group;
  Control* control = nullptr;
  float* partials = nullptr;  // num_chunks sums of squares, this group's slice of the step's partials
  bool unscale = false;       // multiply gradients by 1 / control->loss_scale first
};

struct FinalizeArgs {
  Control* control = nullptr;
  const float* partials = nullptr;
  int64_t num_partials = 0;  // 0: no norm pass ran this step
  bool scaling = false;
  bool skip_nonfinite = false;  // an inf/NaN gradient drops the step without loss scaling too (and is counted)
  float max_norm = 0.0f;  // > 0: clip to this global norm
  Schedule schedule = Schedule::Constant;
  double lr = 0.0, min_lr = 0.0;
  int64_t warmup_steps = 0, total_steps = 0;
  Algorithm algorithm = Algorithm::Adam;
  double beta1 = 0.9, beta2 = 0.999, weight_decay = 0.0;
  float growth_factor = 2.0f, backoff_factor = 0.5f;
  int64_t growth_interval = 2000;
};

struct StepArgs {
  GroupTables group;
  bool has_low = false;
  DType low_dtype = DType::Float16;
  const Control* control = nullptr;
  Algorithm algorithm = Algorithm::Adam;
  // The 1 - x factors are rounded from double on the host, as torch rounds its Python-float scalars.
  float one_minus_beta1 = 0.1f, beta2 = 0.999f, one_minus_beta2 = 0.001f, eps = 1e-8f, weight_decay = 0.0f;
  bool decoupled = false, amsgrad = false;
  float momentum = 0.0f, one_minus_dampening = 1.0f;
  bool nesterov = false;
  bool scaling = false, clipping = false;
};

void grad_norm(const NormArgs& args, cudaStream_t stream);
void finalize(const FinalizeArgs& args, cudaStream_t stream);
void step(const StepArgs& args, cudaStream_t stream);

// One row of a buffer-copy table (device memory, built once by the caller): `bytes` bytes from `source` to
// `destination`, which must not overlap.
struct CopyEntry {
  uint64_t source;
  uint64_t destination;
  int64_t bytes;
  int64_t reserved;
};
static_assert(sizeof(CopyEntry) == 32, "the Python side builds this table as int64[4] rows");

// Every row's copy in one launch (a training step's buffer updates: see kernels/copy_buffers.cu).
void copy_buffers(const CopyEntry* entries, int64_t count, cudaStream_t stream);

std::vector<KernelInfo> kernel_table();

// ---- internal: shared by launcher.cu and kernels/*.cu ---------------------------------------------------------
void launch_grad_norm(const NormArgs& args, cudaStream_t stream);
void launch_finalize(const FinalizeArgs& args, cudaStream_t stream);
void launch_step(const StepArgs& args, cudaStream_t stream);
void launch_copy_buffers(const CopyEntry* entries, int64_t count, cudaStream_t stream);

}  // namespace ge2::optimizer
