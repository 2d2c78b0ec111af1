# The flags of every C++ compile, before cpp_run.sh (the run) and cpp_pch.sh (the precompiled headers,
# which g++ uses only for a compile with the same flags).
cpp_flags='-std=c++20 -O1 -Wall -Wextra'
