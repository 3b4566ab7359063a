#include "model/flops.h"

namespace scalestudy {

double forward_flops(const ModelShape& shape, double b, double s) {
  const double h = shape.channels, L = shape.layers, V = shape.vocab;
  return L * (24.0 * b * s * h * h + 4.0 * b * s * s * h) + 2.0 * b * s * h * V;
}

double training_flops(const ModelShape& shape, double batch, double seq) {
  return 3.0 * forward_flops(shape, batch, seq);
}

double recompute_flops(const ModelShape& shape, double b, double s) {
  const double h = shape.channels, L = shape.layers;
  return L * (24.0 * b * s * h * h + 4.0 * b * s * s * h);
}

}  // namespace scalestudy
