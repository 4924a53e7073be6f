// Pickle opcodes of protocols 0-5, with their byte values as CPython's
// Lib/pickletools.py documents them. The argument layout follows each name:
//   u1/u2/u4/u8   little-endian unsigned of that many bytes
//   i4            little-endian signed 4 bytes
//   line          bytes up to and excluding '\n' (protocol 0 text)
//   lenN+data     an N-byte length prefix, then that many bytes
#pragma once

#include <cstdint>

namespace ckpt::pickle {

enum class Opcode : uint8_t {
  // ---- protocol 0 (text) ----
  kMark = '(',      // push a mark on the stack
  kStop = '.',      // end of pickle: the top of the stack is the result
  kPop = '0',       // discard the top of the stack (or the topmost mark)
  kPopMark = '1',   // discard everything down to and including the top mark
  kDup = '2',       // push the top of the stack again
  kFloat = 'F',     // line: Python float repr
  kInt = 'I',       // line: decimal int, "00"/"01" are False/True
  kLong = 'L',      // line: decimal int with optional trailing 'L'
  kNone = 'N',      // push None
  kPersId = 'P',    // line: persistent id (ASCII string)
  kReduce = 'R',    // args = pop, callable = pop, push callable(*args)
  kString = 'S',    // line: quoted Python 2 str with escapes
  kUnicode = 'V',   // line: raw-unicode-escape encoded str
  kAppend = 'a',    // value = pop, append to the list on top
  kBuild = 'b',     // state = pop, apply to the object on top
  kGlobal = 'c',    // line module, line name: push the global
  kDict = 'd',      // dict from key/value pairs down to the top mark
  kAppends = 'e',   // extend the list below the mark with the items above it
  kGet = 'g',       // line: decimal memo index to push
  kInst = 'i',      // line module, line name: call class with items down to mark
  kList = 'l',      // list from items down to the top mark
  kPut = 'p',       // line: decimal memo index to store the top in
  kSetItem = 's',   // value = pop, key = pop, dict on top [key] = value
  kTuple = 't',     // tuple from items down to the top mark
  kSetItems = 'u',  // add key/value pairs above the mark to the dict below it
  // ---- protocol 1 (binary) ----
  kBinInt = 'J',          // i4
  kBinInt1 = 'K',         // u1
  kBinInt2 = 'M',         // u2
  kBinPersId = 'Q',       // pid = pop: persistent id
  kBinString = 'T',       // i4 length + bytes (Python 2 str)
  kShortBinString = 'U',  // u1 length + bytes (Python 2 str)
  kBinUnicode = 'X',      // u4 length + UTF-8
  kEmptyDict = '}',
  kEmptyList = ']',
  kEmptyTuple = ')',
  kObj = 'o',         // class and args down to the top mark: cls(*args)
  kBinGet = 'h',      // u1 memo index
  kLongBinGet = 'j',  // u4 memo index
  kBinPut = 'q',      // u1 memo index
  kLongBinPut = 'r',  // u4 memo index
  kBinFloat = 'G',    // 8-byte big-endian IEEE double
  // ---- protocol 2 ----
  kProto = 0x80,   // u1 protocol number
  kNewObj = 0x81,  // args = pop, cls = pop: cls.__new__(cls, *args)
  kExt1 = 0x82,    // u1 extension registry code
  kExt2 = 0x83,    // u2 extension registry code
  kExt4 = 0x84,    // i4 extension registry code
  kTuple1 = 0x85,
  kTuple2 = 0x86,
  kTuple3 = 0x87,
  kNewTrue = 0x88,
  kNewFalse = 0x89,
  kLong1 = 0x8a,  // u1 length + little-endian two's complement
  kLong4 = 0x8b,  // i4 length + little-endian two's complement
  // ---- protocol 3 ----
  kBinBytes = 'B',       // u4 length + bytes
  kShortBinBytes = 'C',  // u1 length + bytes
  // ---- protocol 4 ----
  kShortBinUnicode = 0x8c,  // u1 length + UTF-8
  kBinUnicode8 = 0x8d,      // u8 length + UTF-8
  kBinBytes8 = 0x8e,        // u8 length + bytes
  kEmptySet = 0x8f,
  kAddItems = 0x90,     // add the items above the mark to the set below it
  kFrozenSet = 0x91,    // frozenset from items down to the top mark
  kNewObjEx = 0x92,     // kwargs = pop, args = pop, cls = pop
  kStackGlobal = 0x93,  // name = pop, module = pop (both str)
  kMemoize = 0x94,      // store the top in memo[len(memo)]
  kFrame = 0x95,        // u8 length of the frame that follows
  // ---- protocol 5 ----
  kByteArray8 = 0x96,      // u8 length + bytes
  kNextBuffer = 0x97,      // out-of-band buffer
  kReadOnlyBuffer = 0x98,  // make the top buffer read-only
};

// "BINUNICODE" for Opcode::kBinUnicode; nullptr for a byte that is no opcode.
const char* opcode_name(uint8_t byte);

}  // namespace ckpt::pickle
