// Record signatures and fixed sizes of the zip format (PKWARE APPNOTE 6.3.x,
// section 4.3), shared by the reader and the writer, plus little-endian
// load/store helpers. The byte diagrams live at the top of zip_reader.cc and
// zip_writer.cc. Private to src/archive.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ckpt::archive {

inline constexpr uint32_t kLocalHeaderSignature = 0x04034b50;     // "PK\3\4", 4.3.7
inline constexpr uint32_t kDataDescriptorSignature = 0x08074b50;  // "PK\7\8", 4.3.9
inline constexpr uint32_t kCentralHeaderSignature = 0x02014b50;   // "PK\1\2", 4.3.12
inline constexpr uint32_t kZip64EocdSignature = 0x06064b50;       // "PK\6\6", 4.3.14
inline constexpr uint32_t kZip64LocatorSignature = 0x07064b50;    // "PK\6\7", 4.3.15
inline constexpr uint32_t kEocdSignature = 0x06054b50;            // "PK\5\6", 4.3.16

inline constexpr std::size_t kLocalHeaderSize = 30;
inline constexpr std::size_t kCentralHeaderSize = 46;
inline constexpr std::size_t kZip64EocdSize = 56;  // without the extensible data sector
inline constexpr std::size_t kZip64LocatorSize = 20;
inline constexpr std::size_t kEocdSize = 22;
inline constexpr std::size_t kMaxCommentSize = 0xffff;

inline constexpr uint16_t kZip64ExtraId = 0x0001;    // 4.5.3
inline constexpr uint16_t kPaddingExtraId = 0x4246;  // "FB": torch's alignment padding
inline constexpr uint16_t kFlagEncrypted = 1 << 0;
inline constexpr uint16_t kFlagDataDescriptor = 1 << 3;
inline constexpr uint16_t kFlagUtf8 = 1 << 11;
inline constexpr uint16_t kMethodStored = 0;

// A 32-bit (16-bit) field holding this value defers to the ZIP64 record.
inline constexpr uint32_t kZip64Marker32 = 0xffffffff;
inline constexpr uint16_t kZip64Marker16 = 0xffff;

inline uint16_t load_u16(const unsigned char* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
inline uint32_t load_u32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}
inline uint64_t load_u64(const unsigned char* p) {
  return static_cast<uint64_t>(load_u32(p)) | static_cast<uint64_t>(load_u32(p + 4)) << 32;
}

// Why a full entry name would escape the archive when extracted (absolute,
// backslash, NUL, empty, "." or ".." component), or nullptr when it is safe.
const char* name_escape_reason(std::string_view name);

// Appends little-endian fields to a byte string.
inline void store_u16(std::string& out, uint16_t v) {
  out.push_back(static_cast<char>(v & 0xff));
  out.push_back(static_cast<char>(v >> 8));
}
inline void store_u32(std::string& out, uint32_t v) {
  store_u16(out, static_cast<uint16_t>(v & 0xffff));
  store_u16(out, static_cast<uint16_t>(v >> 16));
}
inline void store_u64(std::string& out, uint64_t v) {
  store_u32(out, static_cast<uint32_t>(v & 0xffffffff));
  store_u32(out, static_cast<uint32_t>(v >> 32));
}

}  // namespace ckpt::archive
