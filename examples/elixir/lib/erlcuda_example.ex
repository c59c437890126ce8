defmodule ErlcudaExample do
  @moduledoc """
  erlcuda from Elixir: the API is the Erlang module `:erlcuda`, called as is.
  Vectors are lists of numbers, binaries of native-endian f32, or
  `{type, binary}` (`:f64` here); results take the form of the first vector.
  """

  @doc "Waits until every device's gpud is up (the application starts it in the background)."
  def wait_ready(tries \\ 500) do
    devices = :erlcuda.devices()

    cond do
      devices != [] and Enum.all?(devices, &(&1.status == :up)) ->
        devices

      tries == 0 ->
        raise "erlcuda: no device came up: #{inspect(devices)}"

      true ->
        Process.sleep(10)
        wait_ready(tries - 1)
    end
  end

  @doc """
  alpha * x + y on f64 vectors, as Elixir floats: `:erlcuda.from_list/2`
  makes the typed binaries, `:erlcuda.to_list/1` reads the result.
  """
  def saxpy(alpha, xs, ys) do
    {:ok, out} =
      :erlcuda.launch_sync(:saxpy, [alpha, :erlcuda.from_list(:f64, xs), :erlcuda.from_list(:f64, ys)])

    :erlcuda.to_list(out)
  end

  @doc "The dot product of two lists, launched without waiting; the answer is a message."
  def dot_async(xs, ys) do
    {:ok, ref} = :erlcuda.launch(:dot_product, [xs, ys])

    receive do
      {:erlcuda, ^ref, result} -> result
    after
      5000 -> {:error, :timeout}
    end
  end
end
