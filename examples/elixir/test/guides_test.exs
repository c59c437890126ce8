defmodule ErlcudaExample.GuidesTest do
  # The Elixir blocks of erlcuda's README and getting-started guide run
  # here, as the Erlang ones run in test/erlcuda_guides_SUITE.erl: a block
  # fenced ```elixir runs (each in a process of its own, a match that fails
  # fails the test); ```elixir norun is shown, not run (a mix.exs excerpt).
  use ExUnit.Case, async: false

  @root Path.expand("../../..", __DIR__)
  @docs ["README.md", "guides/getting-started.md"]

  setup_all do
    {:ok, _} = Application.ensure_all_started(:erlcuda)
    :ok
  end

  for doc <- @docs do
    test "the Elixir blocks of #{doc} run" do
      blocks = elixir_blocks(Path.join(@root, unquote(doc)))
      assert blocks != [], "no runnable elixir block in #{unquote(doc)}"

      for {line, code} <- blocks do
        task = Task.async(fn -> Code.eval_string(code, [], file: unquote(doc), line: line) end)
        assert {_, _} = Task.await(task, 60_000)
      end
    end
  end

  # {first line of the code, code} of every ```elixir block not marked norun.
  defp elixir_blocks(path) do
    path
    |> File.read!()
    |> String.split("\n")
    |> Enum.with_index(1)
    |> Enum.reduce({nil, []}, fn
      {"```elixir", n}, {nil, acc} -> {{n + 1, []}, acc}
      {"```", _}, {{start, lines}, acc} -> {nil, [{start, Enum.join(Enum.reverse(lines), "\n")} | acc]}
      {line, _}, {{start, lines}, acc} -> {{start, [line | lines]}, acc}
      _, state -> state
    end)
    |> elem(1)
    |> Enum.reverse()
  end
end
