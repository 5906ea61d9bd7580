// --from-hf: convert a checkpoint on the Hugging Face hub (io/http_download.h) shard by shard
// (shard_feed.h): each shard downloads while the one before converts and is deleted once converted
// unless asked to keep them, so the disk holds the container and about two shards at most. A kill
// at any point and a rerun continue where it stopped. A repo that already holds a .qpack
// container is downloaded as is (manifest.json last) and checked.
#pragma once

#include "convert/repack.h"

#include <string>

namespace swiftlet {

// download_dir empty: OUT.download beside the output. keep_download: the shards stay there.
RepackStats repack_from_hf(const std::string& repo, const std::string& revision,
                           const std::string& download_dir, bool keep_download, const RepackOptions& opts);

}  // namespace swiftlet
