// Every row of the spec field table (Note [Spec field table] in
// engine/spec/spec_fields.h) together with its section, for the
// table-driven tests. Define
//   MEGATRAIN_NUMBER_ROW(section, name, kind, range)   or
//   MEGATRAIN_KEYWORD_ROW(section, name, keywords)
// then write MEGATRAIN_EACH_NUMBER_ROW or MEGATRAIN_EACH_KEYWORD_ROW (one
// expansion per row, `section` the JobSpec member and proto message name:
// train, optimizer, eval, checkpoint, memory), then #undef the macro.
#ifndef MEGATRAIN_TESTS_TESTING_SPEC_ROWS_H_
#define MEGATRAIN_TESTS_TESTING_SPEC_ROWS_H_

#include "engine/spec/spec_fields.h"

#define MEGATRAIN_NUMBER_ROW_OF_TRAIN(name, kind, range, json, proto) \
  MEGATRAIN_NUMBER_ROW(train, name, kind, range)
#define MEGATRAIN_NUMBER_ROW_OF_OPTIMIZER(name, kind, range, json, proto) \
  MEGATRAIN_NUMBER_ROW(optimizer, name, kind, range)
#define MEGATRAIN_NUMBER_ROW_OF_EVAL(name, kind, range, json, proto) \
  MEGATRAIN_NUMBER_ROW(eval, name, kind, range)
#define MEGATRAIN_NUMBER_ROW_OF_CHECKPOINT(name, kind, range, json, proto) \
  MEGATRAIN_NUMBER_ROW(checkpoint, name, kind, range)
#define MEGATRAIN_EACH_NUMBER_ROW                                      \
  MEGATRAIN_TRAIN_NUMBER_FIELDS(MEGATRAIN_NUMBER_ROW_OF_TRAIN)         \
  MEGATRAIN_OPTIMIZER_NUMBER_FIELDS(MEGATRAIN_NUMBER_ROW_OF_OPTIMIZER) \
  MEGATRAIN_EVAL_NUMBER_FIELDS(MEGATRAIN_NUMBER_ROW_OF_EVAL)           \
  MEGATRAIN_CHECKPOINT_NUMBER_FIELDS(MEGATRAIN_NUMBER_ROW_OF_CHECKPOINT)

#define MEGATRAIN_KEYWORD_ROW_OF_TRAIN(name, keywords, json) \
  MEGATRAIN_KEYWORD_ROW(train, name, keywords)
#define MEGATRAIN_KEYWORD_ROW_OF_OPTIMIZER(name, keywords, json) \
  MEGATRAIN_KEYWORD_ROW(optimizer, name, keywords)
#define MEGATRAIN_KEYWORD_ROW_OF_MEMORY(name, keywords, json) \
  MEGATRAIN_KEYWORD_ROW(memory, name, keywords)
#define MEGATRAIN_EACH_KEYWORD_ROW                                       \
  MEGATRAIN_TRAIN_KEYWORD_FIELDS(MEGATRAIN_KEYWORD_ROW_OF_TRAIN)         \
  MEGATRAIN_OPTIMIZER_KEYWORD_FIELDS(MEGATRAIN_KEYWORD_ROW_OF_OPTIMIZER) \
  MEGATRAIN_MEMORY_KEYWORD_FIELDS(MEGATRAIN_KEYWORD_ROW_OF_MEMORY)

#endif  // MEGATRAIN_TESTS_TESTING_SPEC_ROWS_H_
