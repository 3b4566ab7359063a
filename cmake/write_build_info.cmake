# Writes build_info.h with the current git revision, at every build, touching the file
# only when its content changes. Result files name the commit that produced them, so a
# sha frozen at configure time would be wrong after the next commit.
execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY ${SOURCE_DIR}
                OUTPUT_VARIABLE sha OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT sha)
  set(sha "unknown")
else()
  execute_process(COMMAND git status --porcelain --untracked-files=no WORKING_DIRECTORY ${SOURCE_DIR}
                  OUTPUT_VARIABLE changes OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(changes)
    set(sha "${sha}-dirty")
  endif()
endif()
set(content "#pragma once\n// Generated at build time by cmake/write_build_info.cmake.\n#define SCALESTUDY_VERSION \"${VERSION}\"\n#define SCALESTUDY_GIT_SHA \"${sha}\"\n")
if(EXISTS ${OUTPUT})
  file(READ ${OUTPUT} old)
endif()
if(NOT "${old}" STREQUAL "${content}")
  file(WRITE ${OUTPUT} "${content}")
endif()
