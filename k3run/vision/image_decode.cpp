// PNG and JPEG decoding (image_decode.h). Each library call sits in a small function that holds
// the setjmp and no C++ object: libpng/libjpeg errors longjmp back to it, and the state it needs
// lives in a job struct owned (and cleaned up) by the caller, so no destructor is ever skipped.
#include "k3run/vision/image_decode.h"

#include <png.h>
// jpeglib.h needs FILE and size_t declared first.
#include <cstdio>
#include <jerror.h>
#include <jpeglib.h>

#include <csetjmp>
#include <cstring>
#include <new>
#include <string>

namespace k3::vision {

const char* ImageFormatName(ImageFormat format) {
  return format == ImageFormat::kPng ? "PNG" : "JPEG";
}

namespace {

// ---- sniffing and limits ----------------------------------------------------------------

constexpr unsigned char kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};

bool IsPng(std::string_view b) {
  return b.size() >= 8 && std::memcmp(b.data(), kPngSignature, 8) == 0;
}
bool IsJpeg(std::string_view b) {
  return b.size() >= 3 && static_cast<unsigned char>(b[0]) == 0xFF &&
         static_cast<unsigned char>(b[1]) == 0xD8 && static_cast<unsigned char>(b[2]) == 0xFF;
}

std::string Prefix(std::string_view name) { return std::string(name) + ": "; }

Status NotAnImage(std::string_view bytes, std::string_view name) {
  if (bytes.empty()) return Status::Invalid(Prefix(name) + "not a PNG or JPEG image (empty)");
  std::string hex;
  const size_t n = bytes.size() < 8 ? bytes.size() : 8;
  static const char kDigits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (i > 0) hex += ' ';
    hex += kDigits[c >> 4];
    hex += kDigits[c & 15];
  }
  if (bytes.size() > n) hex += " ...";
  return Status::Invalid(Prefix(name) + "not a PNG or JPEG image (first bytes " + hex +
                         "; a PNG starts 89 50 4e 47, a JPEG ff d8 ff)");
}

Status CheckSize(std::string_view name, ImageFormat format, uint64_t w, uint64_t h,
                 const DecodeLimits& limits) {
  const std::string size = std::to_string(w) + "x" + std::to_string(h);
  if (w == 0 || h == 0) {
    return Status::Invalid(Prefix(name) + ImageFormatName(format) + " header gives a " + size +
                           " image: each side must be at least 1 pixel");
  }
  if (w > limits.max_side || h > limits.max_side) {
    return Status::Invalid(Prefix(name) + size + " image: each side must be at most " +
                           std::to_string(limits.max_side) + " pixels");
  }
  if (w * h > limits.max_pixels) {
    return Status::Invalid(Prefix(name) + size + " image has " + std::to_string(w * h) +
                           " pixels: at most " + std::to_string(limits.max_pixels) +
                           " are decoded (Pillow's decompression-bomb limit, which the released "
                           "preprocessor inherits)");
  }
  return Status::Ok();
}

uint32_t ReadBe32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// ---- PNG ------------------------------------------------------------------------------

struct PngJob {
  std::string_view bytes;
  size_t pos = 0;
  bool truncated = false;
  char message[256] = {};
  png_structp png = nullptr;
  png_infop info = nullptr;
  // Header, after png_read_info.
  png_uint_32 width = 0, height = 0;
  int bit_depth = 0, color_type = 0;
  // Output.
  Image* image = nullptr;
  std::vector<png_bytep>* rows = nullptr;

  ~PngJob() {
    if (png != nullptr) png_destroy_read_struct(&png, info != nullptr ? &info : nullptr, nullptr);
  }
};

void PngError(png_structp png, png_const_charp msg) {
  auto* job = static_cast<PngJob*>(png_get_error_ptr(png));
  std::snprintf(job->message, sizeof job->message, "%s", msg);
  png_longjmp(png, 1);
}

void PngWarning(png_structp, png_const_charp) {}  // Pillow shows none either

void PngRead(png_structp png, png_bytep dst, png_size_t n) {
  auto* job = static_cast<PngJob*>(png_get_io_ptr(png));
  if (job->bytes.size() - job->pos < n) {
    job->truncated = true;
    png_error(png, "data ends early");
  }
  std::memcpy(dst, job->bytes.data() + job->pos, n);
  job->pos += n;
}

// Sets the libpng transforms that give Pillow's pixels for each PNG kind (PngImagePlugin's
// _MODES): 16-bit keeps the high byte (png_set_strip_16, as the ;16B unpackers); gray 1/2/4-bit
// scales to 0..255 (as 1, L;2, L;4); gray expands to RGB; palette to RGB, or RGBA when a tRNS
// chunk exists (Pillow's info["transparency"] turns it into an alpha band); a tRNS key on RGB
// is dropped (fill_transparent_bg_with returns an RGB image untouched) and on gray is kept for
// after the resize (transparent_gray).
void SetPngTransforms(PngJob* job) {
  png_structp png = job->png;
  Image& im = *job->image;
  const bool has_trns = png_get_valid(png, job->info, PNG_INFO_tRNS) != 0;
  if (job->bit_depth == 16) png_set_strip_16(png);
  switch (job->color_type) {
    case PNG_COLOR_TYPE_GRAY:
      if (job->bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
      png_set_gray_to_rgb(png);
      im.layout = PixelLayout::kRgb;
      im.nearest_resize = job->bit_depth == 1;
      if (has_trns && job->bit_depth <= 8) {
        png_color_16p key = nullptr;
        png_get_tRNS(png, job->info, nullptr, nullptr, &key);
        if (key != nullptr) im.transparent_gray = key->gray & 0xff;
      }
      break;
    case PNG_COLOR_TYPE_GRAY_ALPHA:
      png_set_gray_to_rgb(png);
      im.layout = PixelLayout::kRgba;
      break;
    case PNG_COLOR_TYPE_PALETTE:
      png_set_palette_to_rgb(png);
      im.nearest_resize = true;
      if (has_trns) {
        png_set_tRNS_to_alpha(png);
        im.layout = PixelLayout::kRgba;
      } else {
        im.layout = PixelLayout::kRgb;
      }
      break;
    case PNG_COLOR_TYPE_RGB:
      im.layout = PixelLayout::kRgb;
      break;
    default:  // PNG_COLOR_TYPE_RGB_ALPHA
      im.layout = PixelLayout::kRgba;
      break;
  }
  png_set_interlace_handling(png);
  png_read_update_info(png, job->info);
}

// Stage 1: header. Returns false after a libpng error (job->message says which).
bool PngReadHeader(PngJob* job) {
  if (setjmp(png_jmpbuf(job->png))) return false;
  png_set_read_fn(job->png, job, PngRead);
  png_read_info(job->png, job->info);
  png_get_IHDR(job->png, job->info, &job->width, &job->height, &job->bit_depth, &job->color_type,
               nullptr, nullptr, nullptr);
  return true;
}

// Stage 2: transforms and pixels into job->image->pixels through job->rows (sized by the
// caller). Returns false after a libpng error.
bool PngReadPixels(PngJob* job) {
  if (setjmp(png_jmpbuf(job->png))) return false;
  SetPngTransforms(job);
  const size_t row_bytes = png_get_rowbytes(job->png, job->info);
  if (row_bytes != size_t{job->width} * static_cast<size_t>(job->image->channels())) {
    png_error(job->png, "unexpected row size after transforms");
  }
  png_read_image(job->png, job->rows->data());
  return true;
}

Status PngFailure(const PngJob& job, std::string_view name) {
  if (job.truncated) {
    return Status::Invalid(Prefix(name) + "truncated PNG: the data ends at byte " +
                           std::to_string(job.bytes.size()) + " before the image is complete");
  }
  return Status::Invalid(Prefix(name) + "corrupt PNG: " + job.message);
}

Result<Image> DecodePng(std::string_view bytes, std::string_view name, const DecodeLimits& limits,
                        bool header_only) {
  // Our own IHDR check first: a 0-pixel or oversized header gets the rule, not libpng's wording.
  const auto* u = reinterpret_cast<const unsigned char*>(bytes.data());
  if (bytes.size() >= 24 && std::memcmp(u + 12, "IHDR", 4) == 0) {
    K3_RETURN_IF_ERROR(
        CheckSize(name, ImageFormat::kPng, ReadBe32(u + 16), ReadBe32(u + 20), limits));
  }
  PngJob job;
  job.bytes = bytes;
  job.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &job, PngError, PngWarning);
  if (job.png != nullptr) job.info = png_create_info_struct(job.png);
  if (job.png == nullptr || job.info == nullptr) {
    return Status::Io(Prefix(name) + "out of memory creating the PNG decoder");
  }
  png_set_user_limits(job.png, limits.max_side, limits.max_side);
  Image image;
  image.format = ImageFormat::kPng;
  job.image = &image;
  if (!PngReadHeader(&job)) return PngFailure(job, name);
  K3_RETURN_IF_ERROR(CheckSize(name, ImageFormat::kPng, job.width, job.height, limits));
  image.width = job.width;
  image.height = job.height;
  if (header_only) return image;

  // The channel count follows from the colour type and tRNS alone (SetPngTransforms decides
  // the same; PngReadPixels checks libpng's row size against it).
  const bool four = job.color_type == PNG_COLOR_TYPE_RGB_ALPHA ||
                    job.color_type == PNG_COLOR_TYPE_GRAY_ALPHA ||
                    (job.color_type == PNG_COLOR_TYPE_PALETTE &&
                     png_get_valid(job.png, job.info, PNG_INFO_tRNS) != 0);
  const size_t stride = size_t{job.width} * (four ? 4 : 3);
  std::vector<png_bytep> rows;
  try {
    image.pixels.resize(stride * job.height);
    rows.resize(job.height);
  } catch (const std::bad_alloc&) {
    return Status::Io(Prefix(name) + "out of memory for a " + std::to_string(job.width) + "x" +
                      std::to_string(job.height) + " image");
  }
  for (size_t y = 0; y < job.height; ++y) rows[y] = image.pixels.data() + y * stride;
  job.rows = &rows;
  if (!PngReadPixels(&job)) return PngFailure(job, name);
  return image;
}

// ---- JPEG -----------------------------------------------------------------------------

// libjpeg-turbo's own fuzz harnesses cap progressive scans so that a crafted file cannot spin;
// real progressive JPEGs use about ten.
constexpr int kMaxJpegScans = 500;

struct JpegJob {
  std::string_view bytes;
  jpeg_decompress_struct cinfo{};
  jpeg_error_mgr err{};
  jpeg_progress_mgr progress{};
  jmp_buf jump{};
  bool created = false;
  bool truncated = false;
  bool too_many_scans = false;
  char message[JMSG_LENGTH_MAX] = {};
  Image* image = nullptr;
  std::vector<uint8_t>* row = nullptr;  // one decoded scanline

  ~JpegJob() {
    if (created) jpeg_destroy_decompress(&cinfo);
  }
};

JpegJob* JobOf(j_common_ptr cinfo) { return static_cast<JpegJob*>(cinfo->client_data); }

[[noreturn]] void JpegErrorExit(j_common_ptr cinfo) {
  JpegJob* job = JobOf(cinfo);
  cinfo->err->format_message(cinfo, job->message);
  std::longjmp(job->jump, 1);
}

// Warnings: a premature end of data is an error (Pillow raises "image file is truncated"); other
// corrupt-data warnings are ignored, as Pillow's decoder ignores them. Nothing is printed.
void JpegEmitMessage(j_common_ptr cinfo, int msg_level) {
  if (msg_level >= 0) return;  // trace messages
  if (cinfo->err->msg_code == JWRN_JPEG_EOF) {
    JpegJob* job = JobOf(cinfo);
    job->truncated = true;
    std::longjmp(job->jump, 1);
  }
  cinfo->err->num_warnings++;
}

void JpegOutputMessage(j_common_ptr) {}

void JpegProgress(j_common_ptr cinfo) {
  auto* d = reinterpret_cast<j_decompress_ptr>(cinfo);
  if (d->input_scan_number > kMaxJpegScans) {
    JpegJob* job = JobOf(cinfo);
    job->too_many_scans = true;
    std::longjmp(job->jump, 1);
  }
}

bool JpegReadHeader(JpegJob* job) {
  if (setjmp(job->jump)) return false;
  job->cinfo.err = jpeg_std_error(&job->err);
  job->err.error_exit = JpegErrorExit;
  job->err.emit_message = JpegEmitMessage;
  job->err.output_message = JpegOutputMessage;
  job->cinfo.client_data = job;
  jpeg_create_decompress(&job->cinfo);
  job->created = true;
  job->progress.progress_monitor = JpegProgress;
  job->cinfo.progress = &job->progress;
  jpeg_mem_src(&job->cinfo, reinterpret_cast<const unsigned char*>(job->bytes.data()),
               static_cast<unsigned long>(job->bytes.size()));
  jpeg_read_header(&job->cinfo, TRUE);
  return true;
}

// Decodes every scanline into job->image->pixels (sized by the caller): gray replicated to RGB,
// YCbCr/RGB as RGB, CMYK/YCCK as inverted CMYK (Pillow's "CMYK;I" rawmode).
bool JpegReadPixels(JpegJob* job) {
  if (setjmp(job->jump)) return false;
  j_decompress_ptr c = &job->cinfo;
  jpeg_start_decompress(c);
  Image& im = *job->image;
  const int in_ch = c->output_components;
  const size_t out_ch = static_cast<size_t>(im.channels());
  if ((in_ch != 1 && in_ch != 3 && in_ch != 4) || c->output_width != im.width ||
      c->output_height != im.height) {
    ERREXIT(c, JERR_CONVERSION_NOTIMPL);
  }
  JSAMPROW row = job->row->data();
  while (c->output_scanline < c->output_height) {
    const size_t y = c->output_scanline;
    if (jpeg_read_scanlines(c, &row, 1) != 1) ERREXIT(c, JERR_INPUT_EOF);
    uint8_t* out = im.pixels.data() + y * im.width * out_ch;
    for (size_t x = 0; x < im.width; ++x) {
      const uint8_t* p = row + x * static_cast<size_t>(in_ch);
      if (in_ch == 1) {
        out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = p[0];
      } else if (in_ch == 3) {
        std::memcpy(out + 3 * x, p, 3);
      } else {
        for (size_t k = 0; k < 4; ++k) out[4 * x + k] = static_cast<uint8_t>(255 - p[k]);
      }
    }
  }
  // Not jpeg_finish_decompress: what follows the last scanline is not needed (Pillow does not
  // read it either), and the destructor's jpeg_destroy_decompress releases everything.
  return true;
}

Status JpegFailure(const JpegJob& job, std::string_view name) {
  if (job.truncated) {
    return Status::Invalid(Prefix(name) + "truncated JPEG: the data ends at byte " +
                           std::to_string(job.bytes.size()) + " before the image is complete");
  }
  if (job.too_many_scans) {
    return Status::Invalid(Prefix(name) + "corrupt JPEG: more than " +
                           std::to_string(kMaxJpegScans) + " progressive scans");
  }
  return Status::Invalid(Prefix(name) + "corrupt or unsupported JPEG: " + job.message);
}

Result<Image> DecodeJpeg(std::string_view bytes, std::string_view name,
                         const DecodeLimits& limits, bool header_only) {
  JpegJob job;
  job.bytes = bytes;
  if (!JpegReadHeader(&job)) return JpegFailure(job, name);
  const jpeg_decompress_struct& c = job.cinfo;
  K3_RETURN_IF_ERROR(CheckSize(name, ImageFormat::kJpeg, c.image_width, c.image_height, limits));
  Image image;
  image.format = ImageFormat::kJpeg;
  image.width = c.image_width;
  image.height = c.image_height;
  switch (c.num_components) {
    case 1: job.cinfo.out_color_space = JCS_GRAYSCALE; image.layout = PixelLayout::kRgb; break;
    case 3: job.cinfo.out_color_space = JCS_RGB; image.layout = PixelLayout::kRgb; break;
    case 4: job.cinfo.out_color_space = JCS_CMYK; image.layout = PixelLayout::kCmyk; break;
    default:
      return Status::Invalid(Prefix(name) + "unsupported JPEG: " +
                             std::to_string(c.num_components) +
                             " components (1 gray, 3 colour or 4 CMYK are decoded)");
  }
  if (header_only) return image;
  std::vector<uint8_t> row;
  try {
    image.pixels.resize(size_t{image.width} * image.height *
                        static_cast<size_t>(image.channels()));
    row.resize(size_t{image.width} * 4);
  } catch (const std::bad_alloc&) {
    return Status::Io(Prefix(name) + "out of memory for a " + std::to_string(image.width) + "x" +
                      std::to_string(image.height) + " image");
  }
  job.image = &image;
  job.row = &row;
  if (!JpegReadPixels(&job)) return JpegFailure(job, name);
  return image;
}

Result<Image> Decode(std::string_view bytes, std::string_view name, const DecodeLimits& limits,
                     bool header_only) {
  if (IsPng(bytes)) return DecodePng(bytes, name, limits, header_only);
  if (IsJpeg(bytes)) return DecodeJpeg(bytes, name, limits, header_only);
  return NotAnImage(bytes, name);
}

}  // namespace

Result<ImageHeader> ProbeImage(std::string_view bytes, std::string_view name,
                               const DecodeLimits& limits) {
  K3_ASSIGN_OR_RETURN(Image image, Decode(bytes, name, limits, /*header_only=*/true));
  ImageHeader header;
  header.format = image.format;
  header.width = image.width;
  header.height = image.height;
  return header;
}

Result<Image> DecodeImage(std::string_view bytes, std::string_view name,
                          const DecodeLimits& limits) {
  return Decode(bytes, name, limits, /*header_only=*/false);
}

Result<Image> ReadImageFile(const std::string& path, Env* env, const DecodeLimits& limits) {
  K3_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(env, path, kMaxImageFileBytes));
  return DecodeImage(bytes, path, limits);
}

}  // namespace k3::vision
