# dtrain_layer(NAME SOURCES... DEPS targets...)
# One static library per layer. A layer links only the layers below it, so a call
# into a layer above fails to link.
function(dtrain_layer name)
  cmake_parse_arguments(L "" "" "SOURCES;DEPS" ${ARGN})
  add_library(dtrain_${name} STATIC ${L_SOURCES})
  add_library(dtrain::${name} ALIAS dtrain_${name})
  target_include_directories(dtrain_${name} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/src>
    $<INSTALL_INTERFACE:include>)
  target_link_libraries(dtrain_${name} PUBLIC ${L_DEPS})
  target_compile_options(dtrain_${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${DTRAIN_WARNING_FLAGS} ${DTRAIN_LIBRARY_FLAGS}>)
  set_target_properties(dtrain_${name} PROPERTIES EXPORT_NAME ${name})
  set_property(GLOBAL APPEND PROPERTY DTRAIN_LAYER_TARGETS dtrain_${name})
endfunction()
