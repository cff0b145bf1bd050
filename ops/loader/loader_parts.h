// Every part the Loader composes, for the files that implement the Loader (loader.h only
// declares them, so that its includers do not compile the whole loader).
#pragma once

#include "io/io_setup.h"
#include "loader/access/random_access.h"
#include "loader/access/tensor_factory.h"
#include "loader/exchange/exchange_protocol.h"
#include "loader/exchange/step_rounds.h"
#include "loader/pass/group_feed.h"
#include "loader/pass/page_cache_views.h"
#include "loader/pass/placement.h"
#include "loader/pass/share_feed.h"
#include "loader/reads/read_scheduler.h"
#include "loader/transfer/borrow_ring.h"
#include "loader/transfer/device_stage.h"
#include "loader/transfer/staging_stream.h"
#include "pool/recycled_blocks.h"
