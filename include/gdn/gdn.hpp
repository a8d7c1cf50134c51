// SPDX-License-Identifier: MIT
// The gdn library: GatedDeltaNet forward and backward on Vulkan compute.
#pragma once

#include "gdn/context.hpp"
#include "gdn/device_info.hpp"
#include "gdn/error.hpp"
#include "gdn/layer.hpp"
#include "gdn/peaks.hpp"
#include "gdn/tensor.hpp"
