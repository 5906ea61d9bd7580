// --from-hf: fetch a checkpoint from the Hugging Face hub (io/http_download.h), then repack it.
// The files go to a download directory first (resumable: an interrupted run continues where it
// stopped) and are removed after a successful conversion unless asked to keep them. A repo that
// already holds a .qpack container is downloaded as is (manifest.json last) and checked.
#pragma once

#include "convert/repack.h"

#include <string>

namespace swiftlet {

// download_dir empty: OUT.download beside the output.
RepackStats repack_from_hf(const std::string& repo, const std::string& revision,
                           const std::string& download_dir, bool keep_download, const RepackOptions& opts);

}  // namespace swiftlet
