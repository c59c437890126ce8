# A mix project that uses erlcuda as a dependency: `make test-elixir` runs
# its tests (guides/getting-started.md, "From Elixir"). erlcuda is a rebar3 project: mix builds
# it with the rebar3 named by MIX_REBAR3 (Debian's /usr/bin/rebar3; Hex is
# not needed), and rebar3's hook builds the NIF and gpud into its priv/.
defmodule ErlcudaExample.MixProject do
  use Mix.Project

  def project do
    [
      app: :erlcuda_example,
      version: "0.1.0",
      elixir: "~> 1.14",
      start_permanent: Mix.env() == :prod,
      deps: deps()
    ]
  end

  def application do
    [extra_applications: [:logger]]
  end

  # In your project: {:erlcuda, git: "<erlcuda's git URL>", branch: "main", manager: :rebar3}
  defp deps do
    [{:erlcuda, path: "../..", manager: :rebar3}]
  end
end
