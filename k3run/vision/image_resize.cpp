// The navit size rule and Pillow's resampling (image_resize.h). Pillow 9.4 references:
// Resample.c (precompute_coeffs, normalize_coeffs_8bpc, ImagingResampleInner), Geometry.c
// (ImagingScaleAffine), Convert.c (rgbA2rgba, rgba2rgbA, cmyk2rgb), Image.py (resize).
#include "k3run/vision/image_resize.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <vector>

namespace k3::vision {

NavitGrid ComputeNavitGrid(uint32_t width, uint32_t height) {
  assert(width >= 1 && height >= 1);
  const double w = width, h = height;
  // Python: in_patch_limit / (max(1.0, w // p) * max(1.0, h // p)), then sqrt.
  const double s1 = std::sqrt(static_cast<double>(kInPatchLimit) /
                              (std::max(1.0, static_cast<double>(width / kPatchSize)) *
                               std::max(1.0, static_cast<double>(height / kPatchSize))));
  const double s2 = static_cast<double>(kMaxResizedSide) / w;
  const double s3 = static_cast<double>(kMaxResizedSide) / h;
  const double scale = std::min({1.0, s1, s2, s3});
  // int(w * scale) truncates; the product is positive.
  const auto side = [&](double v) {
    const auto n = static_cast<uint32_t>(v * scale);
    return std::min(std::max(1u, n), kMaxResizedSide);
  };
  NavitGrid g;
  g.original_width = width;
  g.original_height = height;
  g.resized_width = side(w);
  g.resized_height = side(h);
  g.padded_width = (g.resized_width + kPadMultiple - 1) / kPadMultiple * kPadMultiple;
  g.padded_height = (g.resized_height + kPadMultiple - 1) / kPadMultiple * kPadMultiple;
  g.grid_w = g.padded_width / kPatchSize;
  g.grid_h = g.padded_height / kPatchSize;
  g.tokens = (g.grid_w / kMergeKernel) * (g.grid_h / kMergeKernel);
  return g;
}

namespace {

// ---- bicubic, Pillow's Resample.c --------------------------------------------------------

// 8 bits of result, 2 of headroom for negative lobes and sums over 1.
constexpr int kPrecisionBits = 32 - 8 - 2;

double BicubicFilter(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

struct Taps {
  int ksize = 0;
  std::vector<int> bounds;  // (first input index, count) per output index
  std::vector<int32_t> k;   // ksize fixed-point coefficients per output index
};

// precompute_coeffs + normalize_coeffs_8bpc for the whole source range (box = (0, in_size)).
Taps Precompute(uint32_t in_size, uint32_t out_size) {
  constexpr double kSupport = 2.0;  // bicubic
  const double scale = static_cast<double>(in_size) / out_size;
  const double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = kSupport * filterscale;
  Taps t;
  t.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  const size_t ks = static_cast<size_t>(t.ksize);
  t.bounds.resize(size_t{out_size} * 2);
  t.k.assign(size_t{out_size} * ks, 0);
  std::vector<double> w(ks);
  for (uint32_t xx = 0; xx < out_size; ++xx) {
    const double center = (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > static_cast<int>(in_size)) xmax = static_cast<int>(in_size);
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      const double v = BicubicFilter((x + xmin - center + 0.5) * ss);
      w[static_cast<size_t>(x)] = v;
      ww += v;
    }
    for (int x = 0; x < xmax; ++x) {
      double v = w[static_cast<size_t>(x)];
      if (ww != 0.0) v /= ww;
      const double f = v * (1 << kPrecisionBits);
      t.k[xx * ks + static_cast<size_t>(x)] =
          v < 0 ? static_cast<int32_t>(-0.5 + f) : static_cast<int32_t>(0.5 + f);
    }
    t.bounds[2 * xx] = xmin;
    t.bounds[2 * xx + 1] = xmax;
  }
  return t;
}

inline uint8_t Clip8(int32_t ss) {
  const int32_t v = ss >> kPrecisionBits;
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

}  // namespace

namespace {

// One row of the horizontal pass, CH channels interleaved (a template so that the channel loop
// unrolls). Integer sums: the order of the taps cannot change a result.
template <size_t CH>
void HorizontalRow(const uint8_t* in_row, const Taps& th, uint32_t out_w, uint8_t* out_row) {
  const size_t ks = static_cast<size_t>(th.ksize);
  for (uint32_t xx = 0; xx < out_w; ++xx) {
    const uint8_t* p = in_row + static_cast<size_t>(th.bounds[2 * xx]) * CH;
    const int xmax = th.bounds[2 * xx + 1];
    const int32_t* k = &th.k[xx * ks];
    int32_t ss[CH];
    for (size_t c = 0; c < CH; ++c) ss[c] = 1 << (kPrecisionBits - 1);
    for (int x = 0; x < xmax; ++x) {
      for (size_t c = 0; c < CH; ++c) {
        ss[c] += static_cast<int32_t>(p[static_cast<size_t>(x) * CH + c]) * k[x];
      }
    }
    for (size_t c = 0; c < CH; ++c) out_row[xx * CH + c] = Clip8(ss[c]);
  }
}

void HorizontalPass(const uint8_t* src, uint32_t w, size_t first_row, size_t rows, size_t ch,
                    const Taps& th, uint32_t out_w, uint8_t* out) {
  for (size_t y = 0; y < rows; ++y) {
    const uint8_t* in_row = src + (y + first_row) * w * ch;
    uint8_t* out_row = out + y * out_w * ch;
    switch (ch) {
      case 3: HorizontalRow<3>(in_row, th, out_w, out_row); break;
      case 4: HorizontalRow<4>(in_row, th, out_w, out_row); break;
      default: HorizontalRow<1>(in_row, th, out_w, out_row); break;
    }
  }
}

// The vertical pass, one output row at a time: the taps' rows are summed into a row of int32
// (vectorisable; integer sums, so the same bits as Pillow's per-pixel loop).
void VerticalPass(const uint8_t* in, size_t row_bytes, const Taps& tv, uint32_t out_h,
                  uint8_t* dst) {
  const size_t ks = static_cast<size_t>(tv.ksize);
  std::vector<int32_t> acc(row_bytes);
  for (uint32_t yy = 0; yy < out_h; ++yy) {
    const size_t ymin = static_cast<size_t>(tv.bounds[2 * yy]);
    const int ymax = tv.bounds[2 * yy + 1];
    const int32_t* k = &tv.k[yy * ks];
    std::fill(acc.begin(), acc.end(), int32_t{1} << (kPrecisionBits - 1));
    for (int y = 0; y < ymax; ++y) {
      const uint8_t* row = in + (ymin + static_cast<size_t>(y)) * row_bytes;
      const int32_t ky = k[y];
      for (size_t i = 0; i < row_bytes; ++i) acc[i] += static_cast<int32_t>(row[i]) * ky;
    }
    uint8_t* out_row = dst + size_t{yy} * row_bytes;
    for (size_t i = 0; i < row_bytes; ++i) out_row[i] = Clip8(acc[i]);
  }
}

}  // namespace

void ResizeBicubic8(const uint8_t* src, uint32_t w, uint32_t h, int channels, uint8_t* dst,
                    uint32_t out_w, uint32_t out_h) {
  const size_t ch = static_cast<size_t>(channels);
  const bool need_h = out_w != w;
  const bool need_v = out_h != h;
  if (!need_h && !need_v) {
    std::memcpy(dst, src, size_t{w} * h * ch);
    return;
  }
  const Taps th = Precompute(w, out_w);
  Taps tv = Precompute(h, out_h);
  // Rows of the source the vertical pass reads (ImagingResampleInner's ybox).
  const int ybox_first = tv.bounds[0];
  const int ybox_last = tv.bounds[2 * (out_h - 1)] + tv.bounds[2 * (out_h - 1) + 1];
  if (!need_v) {
    HorizontalPass(src, w, 0, h, ch, th, out_w, dst);
    return;
  }
  if (!need_h) {
    VerticalPass(src, size_t{w} * ch, tv, out_h, dst);
    return;
  }
  for (uint32_t i = 0; i < out_h; ++i) tv.bounds[2 * i] -= ybox_first;
  const size_t rows = static_cast<size_t>(ybox_last - ybox_first);
  std::vector<uint8_t> temp(rows * out_w * ch);
  HorizontalPass(src, w, static_cast<size_t>(ybox_first), rows, ch, th, out_w, temp.data());
  VerticalPass(temp.data(), size_t{out_w} * ch, tv, out_h, dst);
}

void ResizeNearest8(const uint8_t* src, uint32_t w, uint32_t h, int channels, uint8_t* dst,
                    uint32_t out_w, uint32_t out_h) {
  const size_t ch = static_cast<size_t>(channels);
  // Geometry.c ImagingScaleAffine with a = (w/out_w, 0, 0, 0, h/out_h, 0): positions walk by
  // repeated double additions from half a step; (int) truncates; outside the source stays 0.
  const double ax = static_cast<double>(w) / out_w;
  const double ay = static_cast<double>(h) / out_h;
  std::vector<int> xin(out_w);
  double xo = ax * 0.5;
  for (uint32_t x = 0; x < out_w; ++x) {
    xin[x] = xo < 0.0 ? -1 : static_cast<int>(xo);
    xo += ax;
  }
  double yo = ay * 0.5;
  for (uint32_t y = 0; y < out_h; ++y) {
    const int yi = yo < 0.0 ? -1 : static_cast<int>(yo);
    yo += ay;
    uint8_t* out_row = dst + size_t{y} * out_w * ch;
    std::memset(out_row, 0, size_t{out_w} * ch);
    if (yi < 0 || yi >= static_cast<int>(h)) continue;
    const uint8_t* in_row = src + static_cast<size_t>(yi) * w * ch;
    for (uint32_t x = 0; x < out_w; ++x) {
      if (xin[x] < 0 || xin[x] >= static_cast<int>(w)) continue;
      std::memcpy(out_row + x * ch, in_row + static_cast<size_t>(xin[x]) * ch, ch);
    }
  }
}

namespace {

// MULDIV255 of Pillow's ImagingUtils.h: a * b / 255, rounded.
inline uint32_t MulDiv255(uint32_t a, uint32_t b) {
  const uint32_t tmp = a * b + 128;
  return ((tmp >> 8) + tmp) >> 8;
}

inline uint8_t Clip8(uint32_t v) { return static_cast<uint8_t>(v > 255 ? 255 : v); }

void Premultiply(std::vector<uint8_t>& px) {  // Convert.c rgbA2rgba (and lA2la)
  for (size_t i = 0; i + 3 < px.size(); i += 4) {
    const uint32_t a = px[i + 3];
    for (size_t c = 0; c < 3; ++c) px[i + c] = static_cast<uint8_t>(MulDiv255(px[i + c], a));
  }
}

void Unpremultiply(std::vector<uint8_t>& px) {  // Convert.c rgba2rgbA (and la2lA)
  for (size_t i = 0; i + 3 < px.size(); i += 4) {
    const uint32_t a = px[i + 3];
    if (a == 255 || a == 0) continue;
    for (size_t c = 0; c < 3; ++c) px[i + c] = Clip8((255 * uint32_t{px[i + c]}) / a);
  }
}

inline uint8_t Chessboard(uint32_t x, uint32_t y) {
  return ((y / kChessboardSquare + x / kChessboardSquare) % 2 == 1) ? kChessboardGray
                                                                     : kChessboardWhite;
}

// numpy's float32 blend in fill_transparent_bg_with, truncated by astype(uint8). The build
// uses -ffp-contract=off, so no fused multiply-add changes a rounding.
inline uint8_t Blend(uint8_t v, float alpha, uint8_t bg) {
  const float r = alpha * static_cast<float>(v) + (1.0f - alpha) * static_cast<float>(bg);
  return static_cast<uint8_t>(static_cast<int>(r));
}

}  // namespace

std::vector<uint8_t> ResizeToRgb(const Image& image, uint32_t out_w, uint32_t out_h) {
  const int ch = image.channels();
  const size_t n = size_t{out_w} * out_h;
  std::vector<uint8_t> resized(n * static_cast<size_t>(ch));
  const bool same = out_w == image.width && out_h == image.height;
  if (same) {
    std::memcpy(resized.data(), image.pixels.data(), resized.size());
  } else if (image.nearest_resize) {
    ResizeNearest8(image.pixels.data(), image.width, image.height, ch, resized.data(), out_w,
                   out_h);
  } else if (image.layout == PixelLayout::kRgba) {
    std::vector<uint8_t> pre = image.pixels;
    Premultiply(pre);
    ResizeBicubic8(pre.data(), image.width, image.height, ch, resized.data(), out_w, out_h);
    Unpremultiply(resized);
  } else {
    ResizeBicubic8(image.pixels.data(), image.width, image.height, ch, resized.data(), out_w,
                   out_h);
  }

  std::vector<uint8_t> rgb(n * 3);
  switch (image.layout) {
    case PixelLayout::kRgb:
      if (image.transparent_gray < 0) return resized;
      // Pillow's convert_transparent: a pixel equal to the key gets alpha 0, so the blend
      // gives the background exactly; any other pixel keeps alpha 255 and its value.
      for (uint32_t y = 0; y < out_h; ++y) {
        for (uint32_t x = 0; x < out_w; ++x) {
          const size_t i = (size_t{y} * out_w + x) * 3;
          const bool clear = resized[i] == image.transparent_gray;
          for (size_t c = 0; c < 3; ++c) rgb[i + c] = clear ? Chessboard(x, y) : resized[i + c];
        }
      }
      return rgb;
    case PixelLayout::kRgba:
      for (uint32_t y = 0; y < out_h; ++y) {
        for (uint32_t x = 0; x < out_w; ++x) {
          const size_t p = size_t{y} * out_w + x;
          const float alpha = static_cast<float>(resized[p * 4 + 3]) / 255.0f;
          const uint8_t bg = Chessboard(x, y);
          for (size_t c = 0; c < 3; ++c) rgb[p * 3 + c] = Blend(resized[p * 4 + c], alpha, bg);
        }
      }
      return rgb;
    case PixelLayout::kCmyk:
      for (size_t p = 0; p < n; ++p) {  // Convert.c cmyk2rgb
        const uint8_t* q = &resized[p * 4];
        const uint32_t nk = 255u - q[3];
        for (size_t c = 0; c < 3; ++c) {
          const int v = static_cast<int>(nk) - static_cast<int>(MulDiv255(q[c], nk));
          rgb[p * 3 + c] = static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
        }
      }
      return rgb;
  }
  return rgb;
}

}  // namespace k3::vision
