// oneDNN's fp32 linear on weights laid out once at load.
#pragma once

#include "../common.h"

namespace {

// oneDNN's fp32 linear on a weight it laid out once (its blocked format), through the dispatcher.
Tensor onednn_reorder(const Tensor& weight) {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_reorder_linear_weight", "");
  std::vector<c10::IValue> stack{weight, c10::IValue()};
  op.callBoxed(&stack);
  return stack[0].toTensor();
}

// oneDNN builds and keeps one primitive per input shape it meets (up to 1,024 of them, most of a replica's memory
// growth under mixed traffic: an encoder's row count is its batch's token count). Above 64 rows they are padded up
// to a multiple of 32, so that a service meets a few dozen row counts instead of hundreds; a decoding step's rows
// (at most 64 at 16 texts' beams) and a text alone's encoder are left as they are.
int64_t onednn_rows(int64_t rows) { return rows <= 64 ? rows : (rows + 31) / 32 * 32; }

Tensor onednn_linear(const Tensor& x, const Tensor& packed, const Tensor& bias) {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  const int64_t rows = x.dim() == 2 ? x.size(0) : -1, bucket = rows < 0 ? rows : onednn_rows(rows);
  Tensor input = x;
  if (bucket != rows) {
    input = at::empty({bucket, x.size(1)}, x.options());
    input.narrow(0, 0, rows).copy_(x);
    input.narrow(0, rows, bucket - rows).zero_();
  }
  std::vector<c10::IValue> stack{input, packed, bias.defined() ? c10::IValue(bias) : c10::IValue(),
                                 std::string("none"), c10::List<std::optional<at::Scalar>>(),
                                 c10::IValue(std::string(""))};
  op.callBoxed(&stack);
  Tensor out = stack[0].toTensor();
  return bucket != rows ? out.narrow(0, 0, rows) : out;
}

const char* kernel_name(int64_t kernel) {
  switch (kernel) {
    case kLinear: return "linear";
    case kTransposed: return "transposed";
    case kInt8: return "int8";
    case kOneDnn: return "onednn";
    case kTiles: return "tiles";
  }
  return "?";
}


}  // namespace
