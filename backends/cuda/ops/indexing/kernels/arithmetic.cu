// The arithmetic kernels of the indexing module: cumsum, arange, resize and adaptive_avg_pool. Floats compute in
// float32 registers (16-bit storage converted once per element), integers in int64.
#include <algorithm>
#include <cmath>
#include <string>

#include "api.hpp"
#include "status.hpp"

namespace ge2::indexing {
namespace {


// Value access that reads floats into float and integers into int64 (the accumulator types).
template <typename T>
struct Arith {
  using acc_t = float;
  __device__ static acc_t load(const T& v) { return to_float(v); }
  __device__ static T store(acc_t v) { return from_float<T>(v); }
};
template <>
struct Arith<int32_t> {
  using acc_t = int64_t;
  __device__ static acc_t load(int32_t v) { return v; }
  __device__ static int32_t store(acc_t v) { return static_cast<int32_t>(v); }
};
template <>
struct Arith<int64_t> {
  using acc_t = int64_t;
  __device__ static acc_t load(int64_t v) { return v; }
  __device__ static int64_t store(acc_t v) { return v; }
};

// One thread per (outer, inner) line, walking the axis: consecutive threads take consecutive inner positions, so
// the loads and stores of a step are coalesced when inner is large (a scan over the last axis walks rows apart).
template <typename T>
__global__ void __launch_bounds__(kThreads) cumsum_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t outer,
                                                          int64_t extent, int64_t inner, bool exclusive,
                                                          bool reverse) {
  const int64_t lines = outer * inner;
  for (int64_t line = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; line < lines;
       line += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t base = (line / inner) * extent * inner + line % inner;
    typename Arith<T>::acc_t running = 0;
    for (int64_t step = 0; step < extent; ++step) {
      const int64_t offset = base + (reverse ? extent - 1 - step : step) * inner;
      const auto value = Arith<T>::load(x[offset]);
      if (!exclusive) running += value;
      y[offset] = Arith<T>::store(running);
      if (exclusive) running += value;
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) arange_float_kernel(T* __restrict__ y, int64_t count, double start,
                                                                double delta) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    y[i] = from_float<T>(static_cast<float>(start + static_cast<double>(i) * delta));
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) arange_int_kernel(T* __restrict__ y, int64_t count, int64_t start,
                                                              int64_t delta) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    y[i] = static_cast<T>(start + i * delta);
  }
}

// x_original of an output coordinate (ONNX Resize), before rounding or interpolation. ONNX's length_resized is
// in_length * scale, not rounded (with given scales it need not be an integer). In double, as the reference: a
// nearest index is a floor or a rounding of it, which float32 could move across an integer.
__device__ __forceinline__ double original_coordinate(int64_t resized, double scale, int64_t in_length,
                                                      Coordinates coordinates) {
  const double resized_length = static_cast<double>(in_length) * scale;
  switch (coordinates) {
    case Coordinates::HalfPixel:
      return (resized + 0.5) / scale - 0.5;
    case Coordinates::PytorchHalfPixel:
      return resized_length > 1.0 ? (resized + 0.5) / scale - 0.5 : 0.0;
    case Coordinates::AlignCorners:
      return resized_length == 1.0 ? 0.0 : static_cast<double>(resized) * (in_length - 1) / (resized_length - 1.0);
    case Coordinates::Asymmetric:
      return resized / scale;
  }
  return 0.0;
}

__device__ __forceinline__ int64_t nearest_index(double coordinate, Rounding rounding, int64_t length) {
  double rounded;
  switch (rounding) {
    case Rounding::RoundPreferFloor:
      rounded = (coordinate - floor(coordinate) == 0.5) ? floor(coordinate) : round(coordinate);
      break;
    case Rounding::RoundPreferCeil:
      rounded = (coordinate - floor(coordinate) == 0.5) ? ceil(coordinate) : round(coordinate);
      break;
    case Rounding::Floor:
      rounded = floor(coordinate);
      break;
    default:
      rounded = ceil(coordinate);
      break;
  }
  const int64_t index = static_cast<int64_t>(rounded);
  return index < 0 ? 0 : (index >= length ? length - 1 : index);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) resize_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                          ResizeGeometry g, int64_t count) {
  // [planes, h, w, channels]: consecutive threads take consecutive channels of one pixel (channels-last reads and
  // writes stay coalesced); channels = 1 is the planar [planes, h, w]
  for (int64_t linear = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; linear < count;
       linear += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t channel = linear % g.channels;
    const int64_t pixel = linear / g.channels;
    const int64_t column = pixel % g.out_w;
    const int64_t row = (pixel / g.out_w) % g.out_h;
    const T* plane = x + (pixel / (g.out_w * g.out_h)) * g.in_h * g.in_w * g.channels + channel;
    const double source_row = original_coordinate(row, g.scale_h, g.in_h, g.coordinates);
    const double source_column = original_coordinate(column, g.scale_w, g.in_w, g.coordinates);
    if (!g.linear) {
      const int64_t r = nearest_index(source_row, g.rounding, g.in_h);
      const int64_t c = nearest_index(source_column, g.rounding, g.in_w);
      y[linear] = plane[(r * g.in_w + c) * g.channels];
      continue;
    }
    // Coordinates outside the input take the edge (ONNX's reference pads with edge values; PyTorch clamps).
    const double r = fmin(fmax(source_row, 0.0), static_cast<double>(g.in_h - 1));
    const double c = fmin(fmax(source_column, 0.0), static_cast<double>(g.in_w - 1));
    const int64_t r0 = static_cast<int64_t>(floor(r)), c0 = static_cast<int64_t>(floor(c));
    const int64_t r1 = r0 + 1 < g.in_h ? r0 + 1 : r0, c1 = c0 + 1 < g.in_w ? c0 + 1 : c0;
    const float wr = static_cast<float>(r - static_cast<double>(r0));
    const float wc = static_cast<float>(c - static_cast<double>(c0));
    const auto at = [&](int64_t i, int64_t j) { return to_float(plane[(i * g.in_w + j) * g.channels]); };
    const float top = at(r0, c0) * (1.0f - wc) + at(r0, c1) * wc;
    const float bottom = at(r1, c0) * (1.0f - wc) + at(r1, c1) * wc;
    y[linear] = from_float<T>(top * (1.0f - wr) + bottom * wr);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) adaptive_avg_pool_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                                     int64_t in_h, int64_t in_w, int64_t out_h,
                                                                     int64_t out_w, int64_t count) {
  for (int64_t linear = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; linear < count;
       linear += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t column = linear % out_w;
    const int64_t row = (linear / out_w) % out_h;
    const T* plane = x + (linear / (out_w * out_h)) * in_h * in_w;
    const int64_t row_begin = row * in_h / out_h, row_end = ((row + 1) * in_h + out_h - 1) / out_h;
    const int64_t column_begin = column * in_w / out_w, column_end = ((column + 1) * in_w + out_w - 1) / out_w;
    float total = 0.0f;
    for (int64_t r = row_begin; r < row_end; ++r) {
      for (int64_t c = column_begin; c < column_end; ++c) total += to_float(plane[r * in_w + c]);
    }
    y[linear] = from_float<T>(total / static_cast<float>((row_end - row_begin) * (column_end - column_begin)));
  }
}

}  // namespace

void cumsum(const void* x, void* y, int64_t outer, int64_t extent, int64_t inner, bool exclusive, bool reverse,
            DType dtype, cudaStream_t stream) {
  const int64_t lines = outer * inner;
  if (lines == 0 || extent == 0) return;
  check_pointer(x, "x");
  check_pointer(y, "y");
  const int blocks = grid_blocks(lines);
  switch (dtype) {
    case DType::Int32:
      cumsum_kernel<int32_t><<<blocks, kThreads, 0, stream>>>(static_cast<const int32_t*>(x),
                                                              static_cast<int32_t*>(y), outer, extent, inner,
                                                              exclusive, reverse);
      break;
    case DType::Int64:
      cumsum_kernel<int64_t><<<blocks, kThreads, 0, stream>>>(static_cast<const int64_t*>(x),
                                                              static_cast<int64_t*>(y), outer, extent, inner,
                                                              exclusive, reverse);
      break;
    default:
      GE2_DISPATCH_FLOATING(dtype, "dtype", {
        cumsum_kernel<scalar_t><<<blocks, kThreads, 0, stream>>>(static_cast<const scalar_t*>(x),
                                                                 static_cast<scalar_t*>(y), outer, extent, inner,
                                                                 exclusive, reverse);
      });
  }
  GE2_CHECK_LAUNCH("indexing cumsum_kernel");
}

void arange(void* y, int64_t count, double start, double delta, DType dtype, cudaStream_t stream) {
  if (count == 0) return;
  check_pointer(y, "y");
  const int blocks = grid_blocks(count);
  switch (dtype) {
    case DType::Int32:
      arange_int_kernel<int32_t><<<blocks, kThreads, 0, stream>>>(static_cast<int32_t*>(y), count,
                                                                  static_cast<int64_t>(start),
                                                                  static_cast<int64_t>(delta));
      break;
    case DType::Int64:
      arange_int_kernel<int64_t><<<blocks, kThreads, 0, stream>>>(static_cast<int64_t*>(y), count,
                                                                  static_cast<int64_t>(start),
                                                                  static_cast<int64_t>(delta));
      break;
    default:
      GE2_DISPATCH_FLOATING(dtype, "dtype", {
        arange_float_kernel<scalar_t><<<blocks, kThreads, 0, stream>>>(static_cast<scalar_t*>(y), count, start,
                                                                       delta);
      });
  }
  GE2_CHECK_LAUNCH("indexing arange_kernel");
}

void resize(const void* x, void* y, const ResizeGeometry& geometry, DType dtype, cudaStream_t stream) {
  const int64_t count = geometry.planes * geometry.out_h * geometry.out_w * geometry.channels;
  if (count == 0) return;
  check_pointer(x, "x");
  check_pointer(y, "y");
  if (geometry.in_h == 0 || geometry.in_w == 0) throw std::invalid_argument("x: resizing an empty plane");
  GE2_DISPATCH_FLOATING(dtype, "dtype", {
    resize_kernel<scalar_t><<<grid_blocks(count), kThreads, 0, stream>>>(
        static_cast<const scalar_t*>(x), static_cast<scalar_t*>(y), geometry, count);
  });
  GE2_CHECK_LAUNCH("indexing resize_kernel");
}

void adaptive_avg_pool(const void* x, void* y, int64_t planes, int64_t in_h, int64_t in_w, int64_t out_h,
                       int64_t out_w, DType dtype, cudaStream_t stream) {
  const int64_t count = planes * out_h * out_w;
  if (count == 0) return;
  check_pointer(x, "x");
  check_pointer(y, "y");
  if (in_h == 0 || in_w == 0) throw std::invalid_argument("x: pooling an empty plane");
  GE2_DISPATCH_FLOATING(dtype, "dtype", {
    adaptive_avg_pool_kernel<scalar_t><<<grid_blocks(count), kThreads, 0, stream>>>(
        static_cast<const scalar_t*>(x), static_cast<scalar_t*>(y), in_h, in_w, out_h, out_w, count);
  });
  GE2_CHECK_LAUNCH("indexing adaptive_avg_pool_kernel");
}

}  // namespace ge2::indexing
