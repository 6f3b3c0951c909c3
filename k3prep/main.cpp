// k3prep: all logic lives in k3prep_lib (k3prep/cli.cpp and below).
#include "k3prep/cli.h"

int main(int argc, char** argv) { return k3::prep::Main(argc, argv); }
