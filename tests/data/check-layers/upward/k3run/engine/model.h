#pragma once
#include "k3run/ops/moe.h"
