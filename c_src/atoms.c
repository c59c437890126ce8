/* atoms.c: the atoms of atoms.h, defined and made from their lists. */
#include "atoms.h"

#define EC_NIF_ATOM_DEFINE(name) ERL_NIF_TERM ATOM_##name;
EC_NIF_ATOMS(EC_NIF_ATOM_DEFINE)
#undef EC_NIF_ATOM_DEFINE

ERL_NIF_TERM TYPE_ATOMS[EC_TYPE_COUNT], SHAPE_ATOMS[EC_SHAPE_COUNT], STATUS_ATOMS[EC_STATUS_COUNT],
    FAULT_ATOMS[EC_FAULT_COUNT];

void atoms_load(ErlNifEnv *env)
{
#define EC_NIF_ATOM_MAKE(name) ATOM_##name = enif_make_atom(env, #name);
    EC_NIF_ATOMS(EC_NIF_ATOM_MAKE)
#undef EC_NIF_ATOM_MAKE
#define TYPE_ATOM(NAME, ID, ATOM, BYTES) TYPE_ATOMS[ID] = enif_make_atom(env, #ATOM);
    EC_TYPES(TYPE_ATOM)
#undef TYPE_ATOM
#define SHAPE_ATOM(NAME, ID, ATOM) SHAPE_ATOMS[ID] = enif_make_atom(env, #ATOM);
    EC_SHAPES(SHAPE_ATOM)
#undef SHAPE_ATOM
#define STATUS_ATOM(NAME, CODE, ATOM) STATUS_ATOMS[CODE] = enif_make_atom(env, #ATOM);
    EC_STATUSES(STATUS_ATOM)
#undef STATUS_ATOM
#define FAULT_ATOM(NAME, CODE, ATOM) FAULT_ATOMS[CODE] = enif_make_atom(env, #ATOM);
    EC_FAULTS(FAULT_ATOM)
#undef FAULT_ATOM
}
