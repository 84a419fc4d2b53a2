// The op faces' native call path: one op call with no Python frame between the caller and the op binding.
//
// Launch: a candidate's launch, one call of its op binding with the problem's arguments bound once (at prepare
// time) and LaunchSlot markers where the call's input and output addresses and its stream go, or an op module's C
// launch (c_launch.hpp: the arguments converted once by the module, called with the addresses and the GIL
// released). It is called as launch(ins, outs, stream), the contract of every candidate launch (plans, the face).
//
// PreparedCall: what ops.<op>.prepare(...) returns. Per call it reads each array's address and checks the array
// against the prepared signature in C++ (a DeviceArray's fields directly; a torch tensor through its C-implemented
// methods; other kinds through the Python signature function), checks or makes the outputs, and calls the launch.
// Errors (a wrong array, an overlapping output) are raised by the face's Python callbacks, so their messages are
// the face's own.
#include <Python.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "c_launch.hpp"
#include "device_array.hpp"
#include "launch.hpp"

namespace ge2::runtime {
namespace {

enum class SlotKind { Input, Output, Stream, Inputs, Outputs };

struct LaunchSlot {
  SlotKind kind;
  Py_ssize_t index;
};

struct SlotPosition {
  Py_ssize_t position;
  LaunchSlot slot;
};

// Interned attribute and method names, made once.
struct Names {
  PyObject* shape;
  PyObject* dtype;
  PyObject* get_device;
  PyObject* is_contiguous;
  PyObject* data_ptr;
  PyObject* out;
  PyObject* stream;
};
Names names;

// Turns a C++ exception into the Python error pybind11 would raise; for the CPython-level entry points below.
template <typename Body>
PyObject* guarded(Body&& body) {
  try {
    return body();
  } catch (py::error_already_set& error) {
    error.restore();
  } catch (const std::invalid_argument& error) {
    PyErr_SetString(PyExc_ValueError, error.what());
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
  }
  return nullptr;
}

// ---------------------------------------------------------------------------------------------------------------
// Launch
// ---------------------------------------------------------------------------------------------------------------
struct LaunchState {
  py::object function;
  Ge2CLaunch* c_launch = nullptr;  // when `function` is an op module's C launch (its capsule, kept by `function`)
  py::tuple arguments;  // slot positions hold None
  std::vector<SlotPosition> slots;
  Py_ssize_t inputs_needed = 0, outputs_needed = 0;  // 1 + the largest index of a single input/output slot
};

struct LaunchObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  LaunchState* state;
};

PyTypeObject launch_type = {PyVarObject_HEAD_INIT(nullptr, 0)};

// The value of one slot as a new reference: `input(i)` from the call's inputs, and so on. Addresses come either as
// Python objects (a launch called from Python: passed through as they are) or as integers (a PreparedCall).
struct CallValues {
  PyObject* const* input_objects = nullptr;  // borrowed; or nullptr when the addresses are integers
  PyObject* const* output_objects = nullptr;
  PyObject* input_sequence = nullptr;        // the inputs as one Python sequence, for an Inputs slot
  PyObject* output_sequence = nullptr;
  const std::uintptr_t* inputs = nullptr;
  const std::uintptr_t* outputs = nullptr;
  Py_ssize_t input_count = 0, output_count = 0;
  PyObject* stream_object = nullptr;
  std::uintptr_t stream = 0;
};

PyObject* address_list(const std::uintptr_t* addresses, Py_ssize_t count) {
  PyObject* list = PyList_New(count);
  if (list == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < count; ++i) {
    PyObject* value = PyLong_FromUnsignedLongLong(addresses[i]);
    if (value == nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SET_ITEM(list, i, value);
  }
  return list;
}

PyObject* slot_value(const LaunchSlot& slot, const CallValues& values) {
  switch (slot.kind) {
    case SlotKind::Input:
      if (values.input_objects != nullptr) return Py_NewRef(values.input_objects[slot.index]);
      return PyLong_FromUnsignedLongLong(values.inputs[slot.index]);
    case SlotKind::Output:
      if (values.output_objects != nullptr) return Py_NewRef(values.output_objects[slot.index]);
      return PyLong_FromUnsignedLongLong(values.outputs[slot.index]);
    case SlotKind::Stream:
      if (values.stream_object != nullptr) return Py_NewRef(values.stream_object);
      return PyLong_FromUnsignedLongLong(values.stream);
    case SlotKind::Inputs:
      if (values.input_sequence != nullptr) return Py_NewRef(values.input_sequence);
      return address_list(values.inputs, values.input_count);
    case SlotKind::Outputs:
      if (values.output_sequence != nullptr) return Py_NewRef(values.output_sequence);
      return address_list(values.outputs, values.output_count);
  }
  return nullptr;
}

// Addresses given as Python objects (ints; None for absent) as integers; false with the Python error set.
bool addresses_of(PyObject* const* objects, Py_ssize_t count, std::vector<std::uintptr_t>& addresses) {
  addresses.resize(static_cast<std::size_t>(count));
  for (Py_ssize_t i = 0; i < count; ++i) {
    addresses[i] = objects[i] == Py_None ? 0 : PyLong_AsUnsignedLongLong(objects[i]);
    if (PyErr_Occurred()) return false;
  }
  return true;
}

// An op module's C launch, called with the GIL released; None, or nullptr with the error it reported.
PyObject* call_c_launch(const Ge2CLaunch& launch, const CallValues& values) {
  std::vector<std::uintptr_t> inputs, outputs;
  const std::uintptr_t* in = values.inputs;
  const std::uintptr_t* out = values.outputs;
  std::uintptr_t stream = values.stream;
  if (values.input_objects != nullptr) {  // called from Python: launch(ins, outs, stream)
    if (!addresses_of(values.input_objects, values.input_count, inputs) ||
        !addresses_of(values.output_objects, values.output_count, outputs)) {
      return nullptr;
    }
    in = inputs.data();
    out = outputs.data();
    stream = values.stream_object == Py_None ? 0 : PyLong_AsUnsignedLongLong(values.stream_object);
    if (PyErr_Occurred()) return nullptr;
  }
  char error[1024];
  int status = 0;
  Py_BEGIN_ALLOW_THREADS
  status = launch.call(launch.state, in, out, stream, error, sizeof(error));
  Py_END_ALLOW_THREADS
  if (status == 0) Py_RETURN_NONE;
  PyErr_SetString(status == ge2::binding::kCLaunchBadArgument ? PyExc_ValueError : PyExc_RuntimeError, error);
  return nullptr;
}

// Calls the bound function with the slots filled; a new reference to its result, or nullptr with the error set.
PyObject* call_launch(const LaunchState& state, const CallValues& values) {
  if (values.input_count < state.inputs_needed || values.output_count < state.outputs_needed) {
    PyErr_Format(PyExc_IndexError, "launch: needs %zd input(s) and %zd output(s), got %zd and %zd",
                 state.inputs_needed, state.outputs_needed, values.input_count, values.output_count);
    return nullptr;
  }
  if (state.c_launch != nullptr) return call_c_launch(*state.c_launch, values);
  const Py_ssize_t count = PyTuple_GET_SIZE(state.arguments.ptr());
  constexpr Py_ssize_t kOnStack = 40;
  PyObject* on_stack[kOnStack + 1];
  std::vector<PyObject*> on_heap;
  PyObject** stack = on_stack;
  if (count > kOnStack) {
    on_heap.resize(static_cast<std::size_t>(count) + 1);
    stack = on_heap.data();
  }
  PyObject** arguments = stack + 1;  // one free slot before: PY_VECTORCALL_ARGUMENTS_OFFSET
  for (Py_ssize_t i = 0; i < count; ++i) arguments[i] = PyTuple_GET_ITEM(state.arguments.ptr(), i);
  std::size_t filled = 0;
  PyObject* result = nullptr;
  for (; filled < state.slots.size(); ++filled) {
    PyObject* value = slot_value(state.slots[filled].slot, values);
    if (value == nullptr) break;
    arguments[state.slots[filled].position] = value;
  }
  if (filled == state.slots.size()) {
    result = PyObject_Vectorcall(state.function.ptr(), arguments, count | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
  }
  for (std::size_t i = 0; i < filled; ++i) Py_DECREF(arguments[state.slots[i].position]);
  return result;
}

// launch(ins, outs, stream): ins and outs are sequences of addresses (0 for absent), stream a handle.
PyObject* launch_vectorcall(PyObject* self, PyObject* const* args, std::size_t nargsf, PyObject* kwnames) {
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  if (nargs != 3 || (kwnames != nullptr && PyTuple_GET_SIZE(kwnames) > 0)) {
    PyErr_SetString(PyExc_TypeError, "launch: expected launch(ins, outs, stream), positionally");
    return nullptr;
  }
  PyObject* ins = PySequence_Fast(args[0], "launch: ins must be a sequence of addresses");
  if (ins == nullptr) return nullptr;
  PyObject* outs = PySequence_Fast(args[1], "launch: outs must be a sequence of addresses");
  if (outs == nullptr) {
    Py_DECREF(ins);
    return nullptr;
  }
  CallValues values;
  values.input_objects = PySequence_Fast_ITEMS(ins);
  values.output_objects = PySequence_Fast_ITEMS(outs);
  values.input_sequence = args[0];
  values.output_sequence = args[1];
  values.input_count = PySequence_Fast_GET_SIZE(ins);
  values.output_count = PySequence_Fast_GET_SIZE(outs);
  values.stream_object = args[2];
  PyObject* result = call_launch(*reinterpret_cast<LaunchObject*>(self)->state, values);
  Py_DECREF(ins);
  Py_DECREF(outs);
  if (result == nullptr) return nullptr;
  Py_DECREF(result);  // the binding's return value (a kernel name, say) is not part of the launch contract
  Py_RETURN_NONE;
}

PyObject* launch_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject* function = nullptr;
  PyObject* arguments = nullptr;
  static const char* keywords[] = {"function", "arguments", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!:Launch", const_cast<char**>(keywords), &function,
                                   &PyTuple_Type, &arguments)) {
    return nullptr;
  }
  if (!PyCallable_Check(function) && !PyCapsule_IsValid(function, ge2::binding::kCLaunchCapsule)) {
    PyErr_Format(PyExc_TypeError, "function: expected a callable or an op module's C launch, got %s",
                 Py_TYPE(function)->tp_name);
    return nullptr;
  }
  const bool c_launch = PyCapsule_IsValid(function, ge2::binding::kCLaunchCapsule);
  if (c_launch && PyTuple_GET_SIZE(arguments) > 0) {
    PyErr_SetString(PyExc_TypeError, "arguments: an op module's C launch takes the call's addresses only, no bound "
                                     "arguments");
    return nullptr;
  }
  return guarded([&]() -> PyObject* {
    auto state = std::make_unique<LaunchState>();
    state->function = py::reinterpret_borrow<py::object>(function);
    if (c_launch) {
      state->c_launch = static_cast<Ge2CLaunch*>(PyCapsule_GetPointer(function, ge2::binding::kCLaunchCapsule));
      state->inputs_needed = state->c_launch->inputs;
      state->outputs_needed = state->c_launch->outputs;
    }
    py::list bound;
    const Py_ssize_t count = PyTuple_GET_SIZE(arguments);
    for (Py_ssize_t i = 0; i < count; ++i) {
      py::handle item(PyTuple_GET_ITEM(arguments, i));
      if (py::isinstance<LaunchSlot>(item)) {
        const LaunchSlot slot = item.cast<LaunchSlot>();
        state->slots.push_back({i, slot});
        if (slot.kind == SlotKind::Input) state->inputs_needed = std::max(state->inputs_needed, slot.index + 1);
        if (slot.kind == SlotKind::Output) state->outputs_needed = std::max(state->outputs_needed, slot.index + 1);
        bound.append(py::none());
      } else {
        bound.append(item);
      }
    }
    state->arguments = py::tuple(bound);
    auto* self = reinterpret_cast<LaunchObject*>(type->tp_alloc(type, 0));
    if (self == nullptr) return nullptr;
    self->vectorcall = launch_vectorcall;
    self->state = state.release();
    return reinterpret_cast<PyObject*>(self);
  });
}

void launch_dealloc(PyObject* self) {
  delete reinterpret_cast<LaunchObject*>(self)->state;
  Py_TYPE(self)->tp_free(self);
}

PyObject* launch_repr(PyObject* self) {
  const LaunchState& state = *reinterpret_cast<LaunchObject*>(self)->state;
  return PyUnicode_FromFormat("<ge2 launch of %R with %zd argument(s), %zd slot(s)>", state.function.ptr(),
                              PyTuple_GET_SIZE(state.arguments.ptr()), static_cast<Py_ssize_t>(state.slots.size()));
}

// ---------------------------------------------------------------------------------------------------------------
// PreparedCall
// ---------------------------------------------------------------------------------------------------------------
enum class ArrayKind { Ge2, Torch, Other };

ArrayKind kind_from_name(const std::string& name) {
  if (name == "ge2") return ArrayKind::Ge2;
  if (name == "torch") return ArrayKind::Torch;
  return ArrayKind::Other;
}

// One accepted array signature: its exact type and what the face's signature key holds for that kind.
struct Expected {
  ArrayKind kind = ArrayKind::Other;
  py::object type;
  std::vector<int64_t> shape, strides;  // DeviceArray
  int dtype = 0, device = 0;
  py::object torch_shape, torch_dtype;  // torch (device in `device`; contiguity is checked per call)
  py::object key;                       // other kinds: the signature key
};

// 1 when `array` matches `expected` (its address in `address`), 0 when it does not, -1 with a Python error set.
int read_expected(PyObject* array, const Expected& expected, PyObject* signature, std::uintptr_t& address) {
  if (reinterpret_cast<PyObject*>(Py_TYPE(array)) != expected.type.ptr()) return 0;
  switch (expected.kind) {
    case ArrayKind::Ge2: {
      ArrayFields fields;
      if (!read_device_array(array, fields)) return 0;
      if (*fields.shape != expected.shape || *fields.strides != expected.strides || fields.dtype != expected.dtype ||
          fields.device != expected.device) {
        return 0;
      }
      address = fields.address;
      return 1;
    }
    case ArrayKind::Torch: {
      PyObject* dtype = PyObject_GetAttr(array, names.dtype);
      if (dtype == nullptr) return -1;
      const bool same_dtype = dtype == expected.torch_dtype.ptr();
      Py_DECREF(dtype);
      if (!same_dtype) return 0;
      PyObject* shape = PyObject_GetAttr(array, names.shape);
      if (shape == nullptr) return -1;
      const int same_shape = PyObject_RichCompareBool(shape, expected.torch_shape.ptr(), Py_EQ);
      Py_DECREF(shape);
      if (same_shape <= 0) return same_shape;
      PyObject* device = PyObject_CallMethodNoArgs(array, names.get_device);
      if (device == nullptr) return -1;
      const long device_index = PyLong_AsLong(device);
      Py_DECREF(device);
      if (device_index != expected.device) return PyErr_Occurred() ? -1 : 0;
      PyObject* contiguous = PyObject_CallMethodNoArgs(array, names.is_contiguous);
      if (contiguous == nullptr) return -1;
      const bool is_contiguous = contiguous == Py_True;
      Py_DECREF(contiguous);
      if (!is_contiguous) return 0;
      PyObject* pointer = PyObject_CallMethodNoArgs(array, names.data_ptr);
      if (pointer == nullptr) return -1;
      address = PyLong_AsUnsignedLongLong(pointer);
      Py_DECREF(pointer);
      return PyErr_Occurred() ? -1 : 1;
    }
    case ArrayKind::Other: {
      PyObject* pair = PyObject_CallOneArg(signature, array);
      if (pair == nullptr) return -1;
      int same = -1;
      if (PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2) {
        same = PyObject_RichCompareBool(PyTuple_GET_ITEM(pair, 0), expected.key.ptr(), Py_EQ);
        if (same == 1) {
          address = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(pair, 1));
          if (PyErr_Occurred()) same = -1;
        }
      } else {
        PyErr_SetString(PyExc_TypeError, "signature: expected a (key, address) pair");
      }
      Py_DECREF(pair);
      return same;
    }
  }
  return 0;
}

// The signature of `array` as an Expected (the array was validated by the face before).
Expected expected_of(py::handle array, ArrayKind kind, py::handle signature) {
  Expected expected;
  ArrayFields fields;
  if (kind == ArrayKind::Ge2 && !read_device_array(array, fields)) kind = ArrayKind::Other;  // another GE2 type
  expected.kind = kind;
  expected.type = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(Py_TYPE(array.ptr())));
  switch (kind) {
    case ArrayKind::Ge2: {
      expected.shape = *fields.shape;
      expected.strides = *fields.strides;
      expected.dtype = fields.dtype;
      expected.device = fields.device;
      break;
    }
    case ArrayKind::Torch:
      expected.torch_shape = array.attr(names.shape);
      expected.torch_dtype = array.attr(names.dtype);
      expected.device = array.attr(names.get_device)().cast<int>();
      break;
    case ArrayKind::Other:
      expected.key = signature(array).cast<py::tuple>()[0];
      break;
  }
  return expected;
}

// The address of an output the face just made (of the kind the makers make).
int address_of_made(PyObject* array, ArrayKind kind, PyObject* signature, std::uintptr_t& address) {
  if (kind == ArrayKind::Ge2) {
    ArrayFields fields;
    if (read_device_array(array, fields)) {
      address = fields.address;
      return 1;
    }
  }
  PyObject* pointer = nullptr;
  if (kind == ArrayKind::Torch) {
    pointer = PyObject_CallMethodNoArgs(array, names.data_ptr);
  } else {
    PyObject* pair = PyObject_CallOneArg(signature, array);
    if (pair == nullptr) return -1;
    pointer = Py_NewRef(PyTuple_GetItem(pair, 1));
    Py_DECREF(pair);
  }
  if (pointer == nullptr) return -1;
  address = PyLong_AsUnsignedLongLong(pointer);
  Py_DECREF(pointer);
  return PyErr_Occurred() ? -1 : 1;
}

constexpr std::size_t kAcceptedPerOutput = 8;  // output signatures remembered per output (oldest dropped first)

struct PreparedState {
  py::object launch;   // a Launch, or any callable launch(ins, outs, stream)
  py::str op, kernel;
  bool variadic = false;
  bool aligned = false;                // the kernel was chosen for 16-byte aligned inputs
  std::vector<bool> present;           // per input: False where the prepared input was absent (None)
  std::vector<Expected> inputs;        // per input (unused where absent)
  std::vector<int64_t> in_bytes, out_bytes;
  // Per output; shared pointers because the Python calls made while checking one may let another thread add more.
  std::vector<std::vector<std::shared_ptr<const Expected>>> accepted;
  py::tuple make_outputs;              // callables making new outputs
  ArrayKind made_kind = ArrayKind::Other;
  py::object input_error;              // input_error(index, array): raises the face's error
  py::object check_output;             // check_output(index, array) -> kind name (raises for a bad output);
                                       // check_output(None, out) raises the count error
  py::object check_overlap;            // check_overlap(index, address, input addresses): raises unless allowed
  py::object signature;                // ge2.device.signature
  py::object stream_handle;            // ge2.device.stream_handle
};

struct PreparedObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PreparedState* state;
};

PyTypeObject prepared_type = {PyVarObject_HEAD_INIT(nullptr, 0)};

// One call on `items` (the inputs, `nargs` of them; absent optional inputs at the end may be left out). Trying
// (the face's forward): an input that does not match returns NotImplemented instead of raising, and the face
// takes its slow path.
PyObject* prepared_invoke(PreparedState& state, PyObject* const* items, Py_ssize_t nargs, PyObject* out,
                          PyObject* stream, bool trying) {
  const Py_ssize_t count = static_cast<Py_ssize_t>(state.present.size());
  if (nargs > count || (state.variadic && nargs != count)) {
    if (trying) Py_RETURN_NOTIMPLEMENTED;
    PyErr_Format(PyExc_TypeError, "%U: the prepared call takes %zd input(s), got %zd", state.op.ptr(), count, nargs);
    return nullptr;
  }
  std::vector<std::uintptr_t> in_addresses(static_cast<std::size_t>(count), 0);
  std::uintptr_t address_bits = 0;
  for (Py_ssize_t i = 0; i < count; ++i) {
    PyObject* array = i < nargs ? items[i] : Py_None;
    int matched = 0;
    if (!state.present[i]) {
      matched = array == Py_None ? 1 : 0;
    } else if (array != Py_None) {
      matched = read_expected(array, state.inputs[i], state.signature.ptr(), in_addresses[i]);
      // The kernel was chosen for 16-byte aligned inputs: a view at an offset needs one that takes any alignment.
      if (matched == 1 && state.aligned && (in_addresses[i] & 15) != 0) matched = 0;
    }
    if (matched < 0) return nullptr;
    if (matched == 0) {
      if (trying) Py_RETURN_NOTIMPLEMENTED;
      PyObject* raised = PyObject_CallFunction(state.input_error.ptr(), "nO", i, array);
      Py_XDECREF(raised);
      if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "%U: input %zd does not match", state.op.ptr(), i);
      return nullptr;
    }
    address_bits |= in_addresses[i];
  }
  // Aligned inputs deserve the kernel chosen for aligned ones: forward leaves a call made for unaligned ones.
  if (trying && !state.aligned && (address_bits & 15) == 0) Py_RETURN_NOTIMPLEMENTED;

  // The outputs: given (checked against the accepted signatures, validated by the face the first time), or new.
  const std::size_t outputs = state.accepted.size();
  std::vector<std::uintptr_t> out_addresses(outputs, 0);
  py::object result;
  if (out == Py_None) {
    py::tuple made(outputs);
    for (std::size_t j = 0; j < outputs; ++j) {
      PyObject* array = PyObject_CallNoArgs(PyTuple_GET_ITEM(state.make_outputs.ptr(), j));
      if (array == nullptr) return nullptr;
      PyTuple_SET_ITEM(made.ptr(), j, array);
      if (address_of_made(array, state.made_kind, state.signature.ptr(), out_addresses[j]) < 0) return nullptr;
    }
    result = outputs == 1 ? py::object(made[0]) : py::object(made);
  } else {
    const bool several = PyList_Check(out) || PyTuple_Check(out);
    PyObject* given = several ? PySequence_Fast(out, "out") : nullptr;
    if (several && given == nullptr) return nullptr;
    const Py_ssize_t given_count = several ? PySequence_Fast_GET_SIZE(given) : 1;
    py::object given_owner = py::reinterpret_steal<py::object>(given);
    if (given_count != static_cast<Py_ssize_t>(outputs)) {
      PyObject* raised = PyObject_CallFunction(state.check_output.ptr(), "OO", Py_None, out);
      Py_XDECREF(raised);
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "out: wrong number of arrays");
      return nullptr;
    }
    for (std::size_t j = 0; j < outputs; ++j) {
      PyObject* array = several ? PySequence_Fast_ITEMS(given)[j] : out;
      int matched = 0;
      for (std::size_t k = 0; k < state.accepted[j].size() && matched == 0; ++k) {
        const std::shared_ptr<const Expected> expected = state.accepted[j][k];
        matched = read_expected(array, *expected, state.signature.ptr(), out_addresses[j]);
      }
      if (matched < 0) return nullptr;
      if (matched == 0) {  // a new kind of output array: the face validates it (or raises), then it is remembered
        PyObject* kind = PyObject_CallFunction(state.check_output.ptr(), "nO", static_cast<Py_ssize_t>(j), array);
        if (kind == nullptr) return nullptr;
        py::object kind_owner = py::reinterpret_steal<py::object>(kind);
        std::shared_ptr<const Expected> expected;
        PyObject* made = guarded([&]() -> PyObject* {
          expected = std::make_shared<const Expected>(
              expected_of(array, kind_from_name(kind_owner.cast<std::string>()), state.signature));
          Py_RETURN_NONE;
        });
        if (made == nullptr) return nullptr;
        Py_DECREF(made);
        auto& accepted = state.accepted[j];
        if (accepted.size() >= kAcceptedPerOutput) accepted.erase(accepted.begin());
        accepted.push_back(expected);
        if (read_expected(array, *expected, state.signature.ptr(), out_addresses[j]) != 1) {
          if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "out: the array changed while it was checked");
          return nullptr;
        }
      }
      // An output must not overlap an input, unless the op may write that input in place: the face decides.
      const std::uintptr_t start = out_addresses[j], end = start + static_cast<std::uintptr_t>(state.out_bytes[j]);
      for (Py_ssize_t i = 0; i < count; ++i) {
        const std::uintptr_t in_start = in_addresses[i];
        const std::uintptr_t in_end = in_start + static_cast<std::uintptr_t>(state.in_bytes[i]);
        if (in_start < end && start < in_end) {
          PyObject* addresses = address_list(in_addresses.data(), count);
          if (addresses == nullptr) return nullptr;
          PyObject* checked = PyObject_CallFunction(state.check_overlap.ptr(), "nKN", static_cast<Py_ssize_t>(j),
                                                    static_cast<unsigned long long>(start), addresses);
          if (checked == nullptr) return nullptr;
          Py_DECREF(checked);
          break;
        }
      }
    }
    if (several) {
      result = outputs == 1 ? py::reinterpret_borrow<py::object>(PySequence_Fast_ITEMS(given)[0])
                            : py::reinterpret_steal<py::object>(PySequence_Tuple(out));
      if (!result) return nullptr;
    } else {
      result = py::reinterpret_borrow<py::object>(out);
    }
  }

  std::uintptr_t stream_address = 0;
  if (stream != Py_None) {
    if (PyLong_CheckExact(stream)) {
      stream_address = PyLong_AsUnsignedLongLong(stream);
    } else {
      PyObject* handle = PyObject_CallOneArg(state.stream_handle.ptr(), stream);
      if (handle == nullptr) return nullptr;
      stream_address = PyLong_AsUnsignedLongLong(handle);
      Py_DECREF(handle);
    }
    if (PyErr_Occurred()) return nullptr;
  }

  PyObject* launched = nullptr;
  if (Py_TYPE(state.launch.ptr()) == &launch_type) {
    CallValues values;
    values.inputs = in_addresses.data();
    values.outputs = out_addresses.data();
    values.input_count = count;
    values.output_count = static_cast<Py_ssize_t>(outputs);
    values.stream = stream_address;
    launched = call_launch(*reinterpret_cast<LaunchObject*>(state.launch.ptr())->state, values);
  } else {
    PyObject* ins = address_list(in_addresses.data(), count);
    PyObject* outs = ins == nullptr ? nullptr : address_list(out_addresses.data(), static_cast<Py_ssize_t>(outputs));
    if (outs != nullptr) launched = PyObject_CallFunction(state.launch.ptr(), "OOK", ins, outs,
                                                          static_cast<unsigned long long>(stream_address));
    Py_XDECREF(ins);
    Py_XDECREF(outs);
  }
  if (launched == nullptr) return nullptr;
  Py_DECREF(launched);
  return result.release().ptr();
}

// p(*inputs, out=None, stream=None); a variadic op's inputs may come as one list.
PyObject* prepared_vectorcall(PyObject* self, PyObject* const* args, std::size_t nargsf, PyObject* kwnames) {
  PreparedState& state = *reinterpret_cast<PreparedObject*>(self)->state;
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  PyObject* out = Py_None;
  PyObject* stream = Py_None;
  const Py_ssize_t keywords = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  for (Py_ssize_t i = 0; i < keywords; ++i) {
    PyObject* name = PyTuple_GET_ITEM(kwnames, i);
    if (PyUnicode_Compare(name, names.out) == 0) {
      out = args[nargs + i];
    } else if (PyUnicode_Compare(name, names.stream) == 0) {
      stream = args[nargs + i];
    } else {
      PyErr_Format(PyExc_TypeError, "%U: the prepared call takes the inputs, out= and stream=, got '%U'",
                   state.op.ptr(), name);
      return nullptr;
    }
  }
  if (state.variadic && nargs == 1 && (PyList_Check(args[0]) || PyTuple_Check(args[0]))) {
    PyObject* sequence = PySequence_Fast(args[0], "inputs");
    if (sequence == nullptr) return nullptr;
    PyObject* result = prepared_invoke(state, PySequence_Fast_ITEMS(sequence), PySequence_Fast_GET_SIZE(sequence),
                                       out, stream, false);
    Py_DECREF(sequence);
    return result;
  }
  return prepared_invoke(state, args, nargs, out, stream, false);
}

// p.try_call(inputs, out, stream): the call, or NotImplemented when an input does not match this signature.
PyObject* prepared_try_call(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "try_call: expected try_call(inputs, out, stream)");
    return nullptr;
  }
  PyObject* sequence = PySequence_Fast(args[0], "try_call: inputs must be a sequence");
  if (sequence == nullptr) return nullptr;
  PyObject* result = prepared_invoke(*reinterpret_cast<PreparedObject*>(self)->state, PySequence_Fast_ITEMS(sequence),
                                     PySequence_Fast_GET_SIZE(sequence), args[1], args[2], true);
  Py_DECREF(sequence);
  return result;
}

PyMethodDef prepared_methods[] = {
    {"try_call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(prepared_try_call)), METH_FASTCALL,
     "try_call(inputs, out, stream): the call, or NotImplemented when an input does not match (the face's "
     "forward then takes its slow path)."},
    {nullptr, nullptr, 0, nullptr},
};

void prepared_dealloc(PyObject* self) {
  delete reinterpret_cast<PreparedObject*>(self)->state;
  Py_TYPE(self)->tp_free(self);
}

PyObject* prepared_repr(PyObject* self) {
  const PreparedState& state = *reinterpret_cast<PreparedObject*>(self)->state;
  return PyUnicode_FromFormat("<prepared %U with kernel %U>", state.op.ptr(), state.kernel.ptr());
}

PyObject* prepared_kernel(PyObject* self, void*) {
  return Py_NewRef(reinterpret_cast<PreparedObject*>(self)->state->kernel.ptr());
}

PyGetSetDef prepared_getset[] = {
    {"kernel", prepared_kernel, nullptr, "The kernel the prepared call launches.", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

void ready(PyTypeObject& type, const char* name, Py_ssize_t size, Py_ssize_t vectorcall_offset, destructor dealloc,
           reprfunc repr, const char* doc) {
  type.tp_name = name;
  type.tp_basicsize = size;
  type.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
  type.tp_vectorcall_offset = vectorcall_offset;
  type.tp_call = PyVectorcall_Call;
  type.tp_dealloc = dealloc;
  type.tp_repr = repr;
  type.tp_doc = doc;
  if (PyType_Ready(&type) < 0) throw py::error_already_set();
}

}  // namespace

void register_launch(py::module_& m) {
  names = {PyUnicode_InternFromString("shape"),         PyUnicode_InternFromString("dtype"),
           PyUnicode_InternFromString("get_device"),    PyUnicode_InternFromString("is_contiguous"),
           PyUnicode_InternFromString("data_ptr"),      PyUnicode_InternFromString("out"),
           PyUnicode_InternFromString("stream")};

  py::class_<LaunchSlot>(m, "LaunchSlot",
                         "Where a Launch puts the call's addresses: input i, output i, the stream, or the lists of "
                         "all input or output addresses.")
      .def(py::init([](const std::string& kind, Py_ssize_t index) {
             static const std::pair<const char*, SlotKind> kinds[] = {{"input", SlotKind::Input},
                                                                      {"output", SlotKind::Output},
                                                                      {"stream", SlotKind::Stream},
                                                                      {"inputs", SlotKind::Inputs},
                                                                      {"outputs", SlotKind::Outputs}};
             if (index < 0) throw std::invalid_argument("index: expected >= 0, got " + std::to_string(index));
             for (const auto& [name, slot_kind] : kinds) {
               if (kind == name) return LaunchSlot{slot_kind, index};
             }
             throw std::invalid_argument("kind: expected one of input, output, stream, inputs, outputs, got '" +
                                         kind + "'");
           }),
           py::arg("kind"), py::arg("index") = 0)
      .def("__repr__", [](const LaunchSlot& slot) {
        static const char* kind_names[] = {"input", "output", "stream", "inputs", "outputs"};
        return std::string("<LaunchSlot ") + kind_names[static_cast<int>(slot.kind)] + " " +
               std::to_string(slot.index) + ">";
      });

  launch_type.tp_new = launch_new;
  ready(launch_type, "graph_executor_v2._runtime.Launch", sizeof(LaunchObject), offsetof(LaunchObject, vectorcall),
        launch_dealloc, launch_repr,
        "Launch(function, arguments): calls function(*arguments) with the LaunchSlot markers replaced by the "
        "call's addresses, or an op module's C launch (a capsule, no arguments) with the addresses directly; called "
        "as launch(ins, outs, stream), the contract of a candidate's launch.");
  prepared_type.tp_getset = prepared_getset;
  prepared_type.tp_methods = prepared_methods;
  ready(prepared_type, "graph_executor_v2._runtime.PreparedCall", sizeof(PreparedObject),
        offsetof(PreparedObject, vectorcall), prepared_dealloc, prepared_repr,
        "ops.<op>.prepare(...)'s result: p(*inputs, out=None, stream=None) for arrays of the prepared signature.");
  m.add_object("Launch", reinterpret_cast<PyObject*>(&launch_type));
  m.add_object("PreparedCall", reinterpret_cast<PyObject*>(&prepared_type));

  m.def(
      "prepared_call",
      [](py::object launch, py::str op, py::str kernel, bool variadic, bool aligned, py::sequence inputs,
         py::sequence kinds,
         std::vector<int64_t> in_bytes, std::vector<int64_t> out_bytes, py::tuple make_outputs, std::string made_kind,
         py::object input_error, py::object check_output, py::object check_overlap, py::object signature,
         py::object stream_handle) {
        auto state = std::make_unique<PreparedState>();
        state->launch = launch;
        state->op = op;
        state->kernel = kernel;
        state->variadic = variadic;
        state->aligned = aligned;
        if (py::len(kinds) != py::len(inputs) || in_bytes.size() != py::len(inputs) ||
            out_bytes.size() != py::len(make_outputs)) {
          throw std::invalid_argument("prepared_call: inputs, kinds and sizes disagree");
        }
        for (std::size_t i = 0; i < py::len(inputs); ++i) {
          py::handle array = inputs[i];
          state->present.push_back(!array.is_none());
          state->inputs.push_back(array.is_none() ? Expected{}
                                                  : expected_of(array, kind_from_name(kinds[i].cast<std::string>()),
                                                                signature));
        }
        state->in_bytes = std::move(in_bytes);
        state->out_bytes = std::move(out_bytes);
        state->accepted.resize(py::len(make_outputs));
        state->make_outputs = make_outputs;
        state->made_kind = kind_from_name(made_kind);
        state->input_error = input_error;
        state->check_output = check_output;
        state->check_overlap = check_overlap;
        state->signature = signature;
        state->stream_handle = stream_handle;
        auto* self = PyObject_New(PreparedObject, &prepared_type);
        if (self == nullptr) throw py::error_already_set();
        self->vectorcall = prepared_vectorcall;
        self->state = state.release();
        return py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(self));
      },
      py::arg("launch"), py::arg("op"), py::arg("kernel"), py::arg("variadic"), py::arg("aligned"), py::arg("inputs"),
      py::arg("kinds"),
      py::arg("in_bytes"), py::arg("out_bytes"), py::arg("make_outputs"), py::arg("made_kind"),
      py::arg("input_error"), py::arg("check_output"), py::arg("check_overlap"), py::arg("signature"),
      py::arg("stream_handle"),
      "The native prepared call of an op face (graph_executor_v2.ops._face builds it; not for direct use).");
}

}  // namespace ge2::runtime
