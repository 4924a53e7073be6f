// What the HDF5 reader's child process (hdf5_reader.h) tells this process
// about a file: its tree of values, each tensor's name, dtype and shape, and
// the facts inspect shows. The child reads the file with libhdf5; this
// process builds the model from the message alone, so the message is
// checked here as hostile input (a child whose heap a corrupt file damaged
// can send anything). No libhdf5 here.
//
// The message is JSON: {"facts": {name: text}, "tensors": [{"name": text,
// "dtype": torch's name, "shape": [extents]}], "nodes": the tree as a table
// of nodes, the root last (hdf5_structure.cc)}.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "model/checkpoint_model.h"

namespace ckpt::hdf5 {

// In the child: the message for a model the reader built. A shared subtree
// (hard-linked groups) is one node, however many paths reach it.
std::string structure_message(const CheckpointModel& model);

// The source of tensor `index`'s bytes: `nbytes` of them; `name` is the
// tensor's (its dataset's path), for messages.
using DatasetSourceFactory = std::function<SourcePtr(std::size_t index, uint64_t nbytes, const std::string& name)>;

// The model a message describes, each tensor one contiguous chunk of the
// file `path` read through `source`. DataLoss naming what is wrong when the
// message is not one structure_message writes.
CheckpointModel model_from_structure(const std::string& message, const std::string& path,
                                     const DatasetSourceFactory& source);

}  // namespace ckpt::hdf5
