// A checkpoint parsed ahead of its open and handed to that open, so that selecting tensors by
// pattern costs no second parse: the Python layer reads the names (tensor_names) to match a
// tensor_filter, then opens with the names that matched, and the open takes the checkpoint
// parsed for the names instead of opening and parsing every file again. Torch-free.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "format/checkpoint.h"

namespace instanttensor::format {

// Keeps `checkpoint` for the next open on the calling thread, replacing (and closing) any kept
// before. One per thread: the names and the open come from one call of the Python layer.
void keep_for_next_open(std::unique_ptr<Checkpoint> checkpoint);

// The checkpoint kept on the calling thread, when it was parsed from exactly `paths` (any order)
// and each of its files is unchanged since: the path still names the same file (device, inode),
// of the same size and modification time. Otherwise nullptr (the open parses afresh). Either way
// nothing stays kept, so the kept files close with the open that took them or here.
std::unique_ptr<Checkpoint> take_kept_checkpoint(std::vector<std::string> paths);

}  // namespace instanttensor::format
