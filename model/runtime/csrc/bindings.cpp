// The runtime's Python bindings and its one translation unit: every part is a header included once here, so the
// per-CPU-level copies of the loops and the anonymous namespace stay one unit.

#ifdef USE_FBGEMM
#include <fbgemm/Utils.h>
#endif
#include "decoding.h"


// TRANSLATE_CPU_ISA: the runtime's loops and int8 tiles limited to `level` (common.h), and
// fbgemm's int8 kernels with them where the level is below this CPU's (before fbgemm's first use, at load).
int limit_cpu_isa(int64_t level) {
  const int now = set_cpu_isa(level);
#ifdef USE_FBGEMM
  if (now < detected_cpu_isa()) {
    fbgemm::fbgemmForceIsa(now >= kIsaAvx2 ? fbgemm::inst_set_t::avx2 : fbgemm::inst_set_t::anyarch);
  }
#endif
  return now;
}

// Prepack an int8 per-channel quantized weight (a quantized tensor made in Python) for fbgemm's dynamic linear.
Packed prepack(const Tensor& quantized) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("quantized::linear_prepack", "")
                       .typed<Packed(Tensor, std::optional<Tensor>)>();
  return op.call(quantized, std::nullopt);
}

// x Wᵀ + b through the int8 kernel alone (tests): activations scaled per row first (`per_row`), or quantized with
// one scale for the whole call as fbgemm does by itself; then `activation` (an Activation, -1 none) as a layer's
// fc1 runs it (SiLU fused into the per-row scale pass). `tiles` ("vnni" or "avx2"): through those int8 tiles
// instead of fbgemm (rows quantized per row either way), on a CPU that has them whatever the level in force.
Tensor int8_linear(const Tensor& x, const Packed& weight, const Tensor& bias, bool per_row, bool reduce_range,
                   int64_t activation, const std::string& tiles) {
  at::InferenceMode guard;
  if (!per_row && tiles.empty()) return weight->apply_dynamic(x, reduce_range).add_(bias);
  const int with = tiles == "vnni" ? kTilesVnni : tiles == "avx2" ? kTilesAvx2 : kTilesNone;
  TORCH_CHECK(tiles.empty() || with != kTilesNone, "unknown int8 tiles '", tiles, "' (vnni or avx2)");
  TORCH_CHECK(with != kTilesVnni || cpu_has_vnni(), "this CPU has no AVX-512 VNNI");
  TORCH_CHECK(with != kTilesAvx2 || (HAVE_AVX2_INT8_KERNEL && detected_cpu_isa() >= kIsaAvx2), "this CPU has no AVX2");
  Linear linear;
  linear.attach_int8(weight, with);
  linear.bias = bias;
  linear.reduce_range = reduce_range;
  return linear.run(x, with != kTilesNone ? kTiles : kInt8, activation);
}

// One number for which tensor each of `tensors` is, where its data lives and how often it was changed in place
// (None: an empty slot): CompiledStep.refresh compares it before every decode. Each word is mixed in by
// h → (h ^ word) · p with p odd, a bijection in h and in the word, so a change to any one word changes the number.
int64_t weights_stamp(const std::vector<std::optional<Tensor>>& tensors) {
  uint64_t h = 14695981039346656037ULL;
  const auto mix = [&h](uint64_t word) { h = (h ^ word) * 1099511628211ULL; };
  for (const auto& tensor : tensors) {
    if (!tensor || !tensor->defined()) {
      mix(0);
      continue;
    }
    mix(reinterpret_cast<uintptr_t>(tensor->unsafeGetTensorImpl()));
    mix(reinterpret_cast<uintptr_t>(tensor->data_ptr()));
    mix(tensor->is_inference() ? 0 : static_cast<uint64_t>(tensor->_version()));  // inference tensors: never updated
  }
  return static_cast<int64_t>(h);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // The codes Python passes (KERNELS and ACTIVATIONS are checked against these at load).
  pybind11::enum_<Kernel>(m, "Kernel")
      .value("linear", kLinear)
      .value("transposed", kTransposed)
      .value("int8", kInt8)
      .value("onednn", kOneDnn)
      .value("tiles", kTiles);
  pybind11::enum_<Activation>(m, "Activation")
      .value("silu", kSilu)
      .value("relu", kRelu)
      .value("gelu", kGelu)
      .value("gelu_tanh", kGeluTanh);
  pybind11::enum_<Capture>(m, "Capture")
      .value("nothing", kCaptureNothing)
      .value("every_head", kCaptureEveryHead)
      .value("one_head", kCaptureOneHead);
  pybind11::class_<LinearPackedParamsBase, Packed>(m, "Int8Weight");
  m.def("prepack", &prepack);
  m.def("int8_linear", &int8_linear, pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("bias"),
        pybind11::arg("per_row"), pybind11::arg("reduce_range"), pybind11::arg("activation") = -1,
        pybind11::arg("tiles") = "");
  m.def("has_vnni", &cpu_has_vnni);
  m.def("int8_tiles", [] { return std::string(int8_tiles_name(int8_tiles())); });
  m.def("set_cpu_isa", &limit_cpu_isa, pybind11::arg("level"));
  m.def("cpu_isa", &cpu_isa);
  m.def("weights_stamp", &weights_stamp, pybind11::arg("tensors"));
  m.def("row_topk", [](const Tensor& scores, int64_t m) {
    at::InferenceMode guard;
    return row_topk(scores, m);
  }, pybind11::arg("scores"), pybind11::arg("m"));
  pybind11::class_<Runtime>(m, "Runtime")
      .def(pybind11::init<Tensor, Tensor, double, int64_t, int64_t, double>())
      .def("add_layer", &Runtime::add_layer)
      .def("add_encoder_layer", &Runtime::add_encoder_layer)
      .def("set_encoder_embedding", &Runtime::set_encoder_embedding)
      .def("encode", &Runtime::encode, pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("cross_key_values", &Runtime::cross_key_values, pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("set_output", &Runtime::set_output)
      .def("choose", &Runtime::choose)
      .def("force", &Runtime::force)
      .def("kernels", &Runtime::kernels)
      .def("logits", [](const Runtime& runtime, const Tensor& x) {
        at::InferenceMode guard;
        return runtime.logits(x);
      })
      .def("output", [](Runtime& runtime, const Tensor& x, int64_t kernel) {
        at::InferenceMode guard;
        return runtime.matmuls().back()->run(x, kernel);
      });
  pybind11::class_<CompiledLoop>(m, "CompiledLoop")
      .def(pybind11::init<Runtime&, int64_t, int64_t, int64_t, int64_t, int64_t>(), pybind11::arg("runtime"),
           pybind11::arg("eos"), pybind11::arg("pad"), pybind11::arg("start"), pybind11::arg("capture_layer"),
           pybind11::arg("capture_head"), pybind11::keep_alive<1, 2>())
      .def("join", &CompiledLoop::join, pybind11::arg("hidden"), pybind11::arg("lengths"), pybind11::arg("beams"),
           pybind11::arg("budgets"), pybind11::arg("min_new_tokens"), pybind11::arg("length_penalties"),
           pybind11::arg("captures"), pybind11::arg("streams"),
           pybind11::arg("constraints") = std::vector<std::vector<std::vector<int64_t>>>(),
           pybind11::arg("forced") = std::vector<std::vector<int64_t>>(),
           pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("cancel", &CompiledLoop::cancel, pybind11::arg("id"))
      .def("set_word_continuations", &CompiledLoop::set_word_continuations, pybind11::arg("tokens"))
      .def("step", &CompiledLoop::step, pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("rows", &CompiledLoop::rows)
      .def("__len__", &CompiledLoop::size);
  using Layout = BeamSearch::Layout;
  const auto flags = [](std::vector<char> Layout::*field) {
    return [field](const Layout& layout) { return std::vector<bool>((layout.*field).begin(), (layout.*field).end()); };
  };
  pybind11::class_<Layout>(m, "Layout")
      .def_readonly("ids", &Layout::ids)
      .def_readonly("previous", &Layout::previous)
      .def_property_readonly("banned", flags(&Layout::banned))
      .def_property_readonly("ending", flags(&Layout::ending))
      .def_readonly("rows", &Layout::rows)
      .def_readonly("widest_beam", &Layout::widest_beam)
      .def_readonly("every_head", &Layout::every_head)
      .def_readonly("one_head", &Layout::one_head)
      .def_readonly("same_sources", &Layout::same_sources)
      .def_readonly("wanted", &Layout::wanted)
      .def_readonly("wanted_width", &Layout::wanted_width)
      .def_readonly("unchanged", &Layout::unchanged);
  pybind11::class_<BeamSearch>(m, "BeamSearch")
      .def(pybind11::init<int64_t, int64_t, int64_t, int64_t>(), pybind11::arg("eos"), pybind11::arg("pad"),
           pybind11::arg("start"), pybind11::arg("positions"))
      .def("join", &BeamSearch::join, pybind11::arg("lengths"), pybind11::arg("beams"), pybind11::arg("budgets"),
           pybind11::arg("min_new_tokens"), pybind11::arg("length_penalties"), pybind11::arg("captures"),
           pybind11::arg("streams"), pybind11::arg("slots"),
           pybind11::arg("constraints") = std::vector<std::vector<std::vector<int64_t>>>(),
           pybind11::arg("forced") = std::vector<std::vector<int64_t>>())
      .def("cancel", &BeamSearch::cancel, pybind11::arg("id"))
      .def("plan", &BeamSearch::plan, pybind11::return_value_policy::reference_internal)
      .def("compact", &BeamSearch::compact, pybind11::return_value_policy::reference_internal)
      .def("advance", &BeamSearch::advance_pools, pybind11::arg("values"), pybind11::arg("tokens"), pybind11::arg("m"),
           pybind11::arg("all_heads"), pybind11::arg("head_rows"), pybind11::arg("wanted") = pybind11::none(),
           pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("take_freed", &BeamSearch::take_freed)
      .def("set_word_continuations", &BeamSearch::set_word_continuations, pybind11::arg("tokens"))
      .def("rows", &BeamSearch::rows)
      .def("beam_rows", &BeamSearch::beam_rows)
      .def("__len__", &BeamSearch::size);
}
