# The wheel's install layout (scripts/wheel.sh, pyproject.toml): scikit-build-core installs into
# the wheel's root, which pip unpacks into the user's site-packages, so
#
#   site-packages/mltrain/_launch.py, __main__.py    the launcher (`mltrain`, `python -m mltrain`)
#   site-packages/mltrain/bin/mltrain                 the binary, its helpers and the CUDA plugin
#   site-packages/mltrain/lib/libdnnl.so.2            oneDNN's sgemm, dlopen'ed (runtime.kernel_route)
#   site-packages/mltrain/share/configs/              the example configs (`mltrain config example`)
#   site-packages/mltrain.libs/                       the rest, grafted by auditwheel repair
#   site-packages/torch/lib, site-packages/nvidia/*   the user's torch 2.15 wheel, never bundled
#
# The binaries find LibTorch through a RUNPATH relative to themselves ($ORIGIN/../../torch/lib),
# so `pip install` next to torch is all it takes; the launcher adds torch's lib folder to
# LD_LIBRARY_PATH only when torch sits elsewhere (a --system-site-packages venv).
set(_bins mltrain)
foreach(_t mltrain_spm mltrain_nccl_check)
  if(TARGET ${_t})
    list(APPEND _bins ${_t})
  endif()
endforeach()
set(_rpath "\$ORIGIN/../../torch/lib" "\$ORIGIN/../lib")
get_filename_component(_site "${MLTRAIN_TORCH_ROOT}" DIRECTORY)
file(GLOB _nv_dirs RELATIVE "${_site}" "${_site}/nvidia/*/lib")
foreach(_d ${_nv_dirs})
  list(APPEND _rpath "\$ORIGIN/../../${_d}")
endforeach()
set(_targets ${_bins})
if(TARGET mltrain_cuda)
  list(APPEND _targets mltrain_cuda)
endif()
set_target_properties(${_targets} PROPERTIES INSTALL_RPATH "${_rpath}")
install(TARGETS ${_bins} RUNTIME DESTINATION mltrain/bin)
if(TARGET mltrain_cuda)
  install(TARGETS mltrain_cuda LIBRARY DESTINATION mltrain/bin)
endif()
# runtime/kernel_route.cpp dlopens libdnnl.so.2 by name: the binary's RUNPATH ($ORIGIN/../lib)
# finds this copy first. auditwheel then grafts what it needs (libOpenCL) like any other library.
find_library(MLTRAIN_DNNL NAMES libdnnl.so.2)
if(MLTRAIN_DNNL)
  get_filename_component(_dnnl "${MLTRAIN_DNNL}" REALPATH)
  install(FILES "${_dnnl}" DESTINATION mltrain/lib RENAME libdnnl.so.2)
else()
  message(NOTICE "mltrain: no libdnnl.so.2: the wheel's kernel_route=onednn falls back to LibTorch's GEMM (apt-get install libdnnl2)")
endif()
install(DIRECTORY "${PROJECT_SOURCE_DIR}/configs/" DESTINATION mltrain/share/configs)
